"""mreg: a model registry with an explicit cache, a content-addressed store and atomic aliases."""

__version__ = "0.1.0"
