"""Every root (home, config, cache, store, hub cache) points into tmp_path; nothing touches the network."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# huggingface_hub reads these at import time: set them before anything imports it.
os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HUB_DOWNLOAD_TIMEOUT"] = "5"
os.environ["HF_HUB_ETAG_TIMEOUT"] = "5"
os.environ.pop("HF_HUB_OFFLINE", None)
os.environ.pop("HF_TOKEN", None)

import pytest
from support.cli import run
from support.tiny_models import write_random_safetensors


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point HOME, XDG config, mreg's cache and store, and the hub cache at tmp_path."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("MREG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MREG_STORE", str(tmp_path / "store"))
    monkeypatch.delenv("MREG_CONFIG", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("MREG_DEBUG", raising=False)
    return tmp_path


@pytest.fixture
def mreg() -> Any:
    """Run `mreg ARGS...` in-process and capture stdout, stderr and the exit code."""
    return run


@pytest.fixture
def store_root(isolated: Path) -> Path:
    """The store root every command uses by default in tests."""
    return isolated / "store"


@pytest.fixture
def cache_root(isolated: Path) -> Path:
    """The cache root every command uses by default in tests."""
    return isolated / "cache"


def write_model(dest: Path, seed: int = 0, size: int = 1 << 16) -> Path:
    """A small model-like directory: a config and a real safetensors file of `size` random bytes (one U8 tensor:
    no float to read for NaN)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    write_random_safetensors(dest / "model.safetensors", size, seed)
    return dest



@pytest.fixture
def model_dir(tmp_path: Path) -> Iterator[Path]:
    """A local model directory to pull from."""
    yield write_model(tmp_path / "src-model")


@pytest.fixture(scope="session")
def llama_cpp_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llama.cpp's files from llama-cpp-python's source package, which `nox -s tests` downloads and names.

    Without MREG_LLAMA_CPP_SDIST (pytest run by hand) the tests that need them skip; with it, any
    problem fails them.
    """
    from support.llama_cpp_source import built_or_skip, source

    return built_or_skip(request, tmp_path_factory, "llama-cpp-source", source)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real CNCF distribution registry on loopback (plain HTTP), one per test module; each test pushes to its own
    repository (the modules' `repo` fixtures)."""
    from support.oci_registry import LocalRegistry, need_binaries

    need_binaries()
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg
