"""mreg: a model registry with an explicit cache, a content-addressed store and atomic aliases.

`from registry import Registry` is the Python API (`registry.client`, its result types in its `__all__`);
`registry.api` has the same operations as functions. Both are loaded on first use, so that what imports one
module of the package (`mreg --help`, a converter's child process) does not load them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from registry.client import Registry

__version__ = "0.1.0"
__all__ = ["Registry", "__version__"]


def __getattr__(name: str) -> Any:
    """`registry.Registry`, imported when first asked for.

    By name (importlib): every module that reads `registry.__version__` imports this one, and the client sits
    above them all (the import contracts in pyproject.toml would otherwise see each of them reach up to it).
    """
    if name == "Registry":
        return importlib.import_module("registry.client").Registry
    raise AttributeError(f"module 'registry' has no attribute {name!r}")
