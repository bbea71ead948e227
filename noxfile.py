"""Developer sessions: tests, lint, demo, bench, docs. Each installs what it needs from this repository."""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True
PYTHON = "3.11"


def _llama_cpp_sdist(session: nox.Session) -> dict[str, str]:
    """Fetch llama-cpp-python's source package (llama.cpp's real vocabularies and converter) with the rest of
    the environment, and name it to the tests and benchmarks: they never download it themselves."""
    out = str(session.run("python", "tests/support/llama_cpp_source.py", ".nox/llama-cpp-source", silent=True) or "")
    sdist = next((line.strip() for line in reversed(out.splitlines()) if line.strip().endswith(".tar.gz")), None)
    if sdist is None:
        session.error(f"tests/support/llama_cpp_source.py named no source package: {out.strip()[-500:]}")
    return {"MREG_LLAMA_CPP_SDIST": sdist}


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite (no GPU; the network only here, for the package registry, never in a test)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs, env=_llama_cpp_sdist(session))


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff, mypy --strict (the code, then the README's and the docs' API examples), the import contracts (the
    architecture), the exported JSON Schema, and the docs site (built with --strict: a broken link, a missing page or
    an include that finds no file fails)."""
    session.install("-e", ".[test,lint,docs]")
    session.run("ruff", "check", ".")
    session.run("mypy")
    session.run("pytest", "-q", "tests/test_docs_examples.py")  # mypy is installed here, not in the tests session
    session.run("lint-imports")
    session.run("python", "-m", "manifests.export", "--check")
    session.run("python", "benchmarks/render.py", "--check")
    session.run("mkdocs", "build", "--strict", "--site-dir", str(Path(session.create_tmp()) / "site"))


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Serve the documentation site on http://127.0.0.1:8000, rebuilt on every change (`-- -a HOST:PORT`)."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "serve", *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The whole loop offline on built-in data: pull from a local hub, register, promote, roll back, mount."""
    session.install("-e", ".", "numpy")  # the core and what builds the tiny model; no converter runtimes
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks (half an hour, ~15 GB of disk): flips, registration, re-pull, S3, GGUF, ONNX, TensorRT for RTX."""
    session.install("-e", ".[test,bench]")
    session.run("python", "benchmarks/bench.py", *session.posargs, env=_llama_cpp_sdist(session))
