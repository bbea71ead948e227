"""What one `mreg convert` of a hub source costs in requests and reads: the hub is listed once, config.json read
once, a given importance matrix hashed once (issue #29: each was done several times, in several places)."""

from __future__ import annotations

import builtins
import io
import struct
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.cli import run
from support.hub_server import LocalHub
from support.tiny_models import build_tiny_llama

from converters.gguf import imatrix
from registry.digest import git_blob_sha1


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> tuple[Counter[str], set[str]]:
    """Every open by mreg of a file of the names given (config.json, and its blob's in the hub cache: the git blob
    id), and every hashing of a file a flag names."""
    seen: Counter[str] = Counter()
    names = {"config.json"}
    real_open, real_hash = builtins.open, imatrix.hash_given

    def opened(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, Path)) and threading.current_thread() is threading.main_thread() \
                and (Path(file).name in names or Path(file).resolve().name in names):
            seen["config.json read"] += 1  # not the hub's reads: it serves from other threads
        return real_open(file, *args, **kwargs)

    def hashed(path: Path, flag: str) -> str:
        seen[f"{Path(path).name} hashed"] += 1
        return real_hash(path, flag)

    monkeypatch.setattr(builtins, "open", opened)
    monkeypatch.setattr(io, "open", opened)  # pathlib's
    monkeypatch.setattr(imatrix, "hash_given", hashed)
    return seen, names


def _imatrix(path: Path) -> Path:
    """A legacy importance matrix whose one entry names no tensor of the model (so it changes no byte)."""
    name = b"blk.99.attn_q.weight"
    path.write_bytes(struct.pack("<ii", 1, len(name)) + name + struct.pack("<ii4f", 1, 4, 1, 2, 3, 4)
                     + struct.pack("<ii", 1, 4) + b"text")
    return path


def test_one_convert_of_a_hub_source_lists_once_and_reads_config_once(tmp_path: Path,
                                                                       counted: tuple[Counter[str], set[str]]
                                                                       ) -> None:
    seen, config_names = counted
    src = build_tiny_llama(tmp_path / "tiny", seed=3)
    imatrix_file = _imatrix(tmp_path / "given, with a comma.imatrix.dat")
    config_names.add(git_blob_sha1((src / "config.json").read_bytes()))
    with LocalHub() as hub:
        hub.add_commit("org/tiny", {p.name: p for p in src.iterdir() if p.is_file()})
        seen.clear()
        hub.reset_counters()
        result = run("convert", "org/tiny", "--to", "gguf:Q4_K_M", "--imatrix", imatrix_file, "--name", "t",
                     "--endpoint", hub.endpoint, "--json")
        listed = sum(1 for _method, path, _headers in hub.requests if path.startswith("/api/models/"))
    assert result.exit_code == 0, result.stderr
    assert seen[f"{imatrix_file.name} hashed"] == 1, "a path with a comma, given through --imatrix, hashed once"
    assert listed == 1, "config.json fetched alone first, then the weights, from one listing"
    assert seen["config.json read"] == 1, "read once: refused early, then the manifest's model info and the converter"
