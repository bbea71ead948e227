"""Tests for tests/support/hub_server.py, run against the real huggingface_hub client.

``huggingface_hub`` copies ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and ``HF_HUB_DISABLE_XET`` into
``huggingface_hub.constants`` when it is first imported, so setting environment variables inside a
test is too late. These tests therefore pass ``endpoint=hub.endpoint`` explicitly to every call and
patch the two flags in ``huggingface_hub.constants`` (as well as the environment, for subprocesses).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder

from support.hub_server import LocalHub  # tests/ is on sys.path (pytest "prepend" import mode, no tests/__init__.py)

REPO = "acme/tiny-model"


def git_blob_sha1(data: bytes) -> str:
    """Return the git blob id of data."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    """Return the git-lfs pointer file of data."""
    sha = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n".encode()


@pytest.fixture(autouse=True)
def hf_online_no_xet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force online mode and plain-HTTP (non-Xet) downloads."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    """A started LocalHub."""
    with LocalHub() as local_hub:
        yield local_hub


@dataclass
class Repo:
    """Contents and commit of the fixture repo."""

    files: dict[str, bytes]
    lfs: set[str]
    sha: str


@pytest.fixture
def repo(hub: LocalHub, tmp_path: Path) -> Repo:
    """A repo with small git files, LFS files (by suffix, by size, and served from disk)."""
    rng = random.Random(0)
    on_disk = tmp_path / "src" / "weights.bin"
    on_disk.parent.mkdir()
    on_disk.write_bytes(rng.randbytes(5000))
    files = {
        "config.json": b'{"hidden_size": 8}\n',
        "README.md": b"# tiny\n",
        "model.safetensors": rng.randbytes(300),  # LFS because of the suffix
        "tokenizer.json": b'{"vocab": "' + b"x" * 4000 + b'"}',  # LFS because of the size
        "sub/dir/notes.txt": b"nested\n",
    }
    sha = hub.add_commit(REPO, {**files, "weights.bin": on_disk}, message="init")
    files["weights.bin"] = on_disk.read_bytes()
    return Repo(files=files, lfs={"model.safetensors", "tokenizer.json", "weights.bin"}, sha=sha)


def test_model_info_files_metadata(hub: LocalHub, repo: Repo) -> None:
    """model_info(files_metadata=True) reports commit, sizes, blob ids and LFS sha256."""
    api = HfApi(endpoint=hub.endpoint)
    for revision in (None, "main", repo.sha):
        info = api.model_info(REPO, revision=revision, files_metadata=True)
        assert info.id == REPO
        assert info.sha == repo.sha
        assert info.private is False
        assert info.siblings is not None
        siblings = {s.rfilename: s for s in info.siblings}
        assert set(siblings) == set(repo.files)
        for path, data in repo.files.items():
            sibling = siblings[path]
            assert sibling.size == len(data)
            if path in repo.lfs:
                assert sibling.lfs is not None
                assert sibling.lfs.sha256 == hashlib.sha256(data).hexdigest()
                assert sibling.lfs.size == len(data)
                assert sibling.lfs.pointer_size == len(lfs_pointer(data))
                assert sibling.blob_id == git_blob_sha1(lfs_pointer(data))
            else:
                assert sibling.lfs is None
                assert sibling.blob_id == git_blob_sha1(data)
    plain = api.model_info(REPO)
    assert plain.siblings is not None
    assert all(s.size is None and s.blob_id is None for s in plain.siblings)


def test_list_repo_tree(hub: LocalHub, repo: Repo) -> None:
    """list_repo_tree lists files and folders, recursively or one level, with LFS info."""
    api = HfApi(endpoint=hub.endpoint)
    entries = list(api.list_repo_tree(REPO, recursive=True, revision=repo.sha))
    files = {e.path: e for e in entries if isinstance(e, RepoFile)}
    folders = {e.path for e in entries if isinstance(e, RepoFolder)}
    assert set(files) == set(repo.files)
    assert folders == {"sub", "sub/dir"}
    for path, data in repo.files.items():
        assert files[path].size == len(data)
        lfs = files[path].lfs
        if path in repo.lfs:
            assert lfs is not None and lfs.sha256 == hashlib.sha256(data).hexdigest()
        else:
            assert lfs is None and files[path].blob_id == git_blob_sha1(data)
    top = {e.path for e in api.list_repo_tree(REPO)}
    assert top == {"sub", "config.json", "README.md", "model.safetensors", "tokenizer.json", "weights.bin"}
    nested = list(api.list_repo_tree(REPO, path_in_repo="sub/dir", expand=True))
    assert [e.path for e in nested] == ["sub/dir/notes.txt"]
    assert isinstance(nested[0], RepoFile) and nested[0].last_commit is not None
    assert nested[0].last_commit.oid == repo.sha


def test_hf_hub_download_cache_layout(hub: LocalHub, repo: Repo, tmp_path: Path) -> None:
    """hf_hub_download (by commit and by branch) writes byte-identical files in the standard cache layout."""
    cache = tmp_path / "cache"
    storage = cache / "models--acme--tiny-model"
    for revision in (repo.sha, "main"):
        for path, data in repo.files.items():
            local = Path(hf_hub_download(REPO, path, revision=revision, cache_dir=cache, endpoint=hub.endpoint))
            assert local == storage / "snapshots" / repo.sha / path
            assert local.read_bytes() == data
            blob_name = hashlib.sha256(data).hexdigest() if path in repo.lfs else git_blob_sha1(data)
            assert local.resolve() == (storage / "blobs" / blob_name).resolve()
    assert (storage / "refs" / "main").read_text() == repo.sha


def test_snapshot_download_commit_and_main(hub: LocalHub, repo: Repo, tmp_path: Path) -> None:
    """snapshot_download pinned to an old commit and to main fetches the right trees; re-pull sends 0 bytes."""
    cache = tmp_path / "cache"
    new_files = {**repo.files, "config.json": b'{"hidden_size": 16}\n'}
    new_sha = hub.add_commit(REPO, new_files, message="bump")
    assert new_sha != repo.sha

    old = Path(snapshot_download(REPO, revision=repo.sha, cache_dir=cache, endpoint=hub.endpoint))
    assert old.name == repo.sha
    for path, data in repo.files.items():
        assert (old / path).read_bytes() == data

    new = Path(snapshot_download(REPO, revision="main", cache_dir=cache, endpoint=hub.endpoint))
    assert new.name == new_sha
    for path, data in new_files.items():
        assert (new / path).read_bytes() == data
    get_paths = [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]
    assert sum(p.endswith("/config.json") for p in get_paths) == 2  # unchanged blobs are not re-fetched

    hub.reset_counters()
    again = snapshot_download(REPO, revision="main", cache_dir=cache, endpoint=hub.endpoint)
    assert Path(again) == new
    assert hub.bytes_sent == 0


@pytest.mark.slow
def test_dropped_connection_is_resumed_with_range(hub: LocalHub, tmp_path: Path) -> None:
    """A connection dropped mid-body is resumed by hf_hub_download with a Range request."""
    chunk = constants.DOWNLOAD_CHUNK_SIZE  # http_get only persists data in chunks of this size (10 MiB)
    data = random.Random(1).randbytes(chunk + 2 * 1024 * 1024)
    hub.add_commit(REPO, {"model.safetensors": data})
    hub.drop_connection_after(REPO, "model.safetensors", chunk + 1024 * 1024)
    local = hf_hub_download(REPO, "model.safetensors", cache_dir=tmp_path, endpoint=hub.endpoint)
    assert Path(local).read_bytes() == data
    gets = [h for m, p, h in hub.requests if m == "GET" and p.endswith("/model.safetensors")]
    assert len(gets) == 2
    assert "Range" not in gets[0]
    assert gets[1]["Range"] == f"bytes={chunk}-"
    assert hub.bytes_sent == (chunk + 1024 * 1024) + (len(data) - chunk)


def test_not_found_errors(hub: LocalHub, repo: Repo, tmp_path: Path) -> None:
    """Unknown repo, revision and file map to the client's dedicated exceptions."""
    api = HfApi(endpoint=hub.endpoint)
    ep = hub.endpoint
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("acme/missing", files_metadata=True)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("acme/missing", "config.json", cache_dir=tmp_path, endpoint=ep)
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("acme/missing", cache_dir=tmp_path, endpoint=ep)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch", files_metadata=True)
    with pytest.raises(RevisionNotFoundError):
        list(api.list_repo_tree(REPO, revision="0" * 40))
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="no-such-branch", cache_dir=tmp_path, endpoint=ep)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO, revision="no-such-branch", cache_dir=tmp_path, endpoint=ep)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO, revision="f" * 40, cache_dir=tmp_path, endpoint=ep)
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(REPO, "missing.txt", cache_dir=tmp_path, endpoint=ep)


def test_resolve_headers_and_ranges(hub: LocalHub, repo: Repo) -> None:
    """HEAD/GET /resolve expose the Hub headers (and no Xet ones) and honour Range."""
    data = repo.files["model.safetensors"]
    url = f"{hub.endpoint}/{REPO}/resolve/main/model.safetensors"
    with httpx2.Client() as client:
        head = client.head(url)
        assert head.status_code == 200
        assert head.headers["X-Repo-Commit"] == repo.sha
        assert head.headers["X-Linked-Etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
        assert head.headers["X-Linked-Size"] == str(len(data))
        assert head.headers["Content-Length"] == str(len(data))
        assert head.headers["Accept-Ranges"] == "bytes"
        assert not [k for k in head.headers if k.lower().startswith("x-xet")]
        small = client.head(f"{hub.endpoint}/{REPO}/resolve/{repo.sha}/config.json")
        assert small.headers["ETag"] == f'"{git_blob_sha1(repo.files["config.json"])}"'
        assert "X-Linked-Size" not in small.headers
        part = client.get(url, headers={"Range": "bytes=100-"})
        assert part.status_code == 206
        assert part.content == data[100:]
        assert part.headers["Content-Range"] == f"bytes 100-{len(data) - 1}/{len(data)}"
        assert client.get(url, headers={"Range": "bytes=10-19"}).content == data[10:20]
        assert client.get(url, headers={"Range": f"bytes={len(data)}-"}).status_code == 416
        missing = client.head(f"{hub.endpoint}/{REPO}/resolve/main/nope.txt")
        assert missing.status_code == 404
        assert missing.headers["X-Error-Code"] == "EntryNotFound"
        assert client.get(f"{hub.endpoint}/api/models/acme/nope").headers["X-Error-Code"] == "RepoNotFound"


def test_fault_injection(hub: LocalHub, repo: Repo, tmp_path: Path) -> None:
    """corrupt, announce_size and add_raw_sibling behave as documented."""
    api = HfApi(endpoint=hub.endpoint)
    data = repo.files["model.safetensors"]
    hub.corrupt(REPO, "model.safetensors")
    local = Path(hf_hub_download(REPO, "model.safetensors", cache_dir=tmp_path / "a", endpoint=hub.endpoint))
    assert len(local.read_bytes()) == len(data) and local.read_bytes() != data  # the client does not verify sha256

    hub.announce_size(REPO, "weights.bin", 10**15)
    info = api.model_info(REPO, files_metadata=True)
    assert info.siblings is not None
    sibling = next(s for s in info.siblings if s.rfilename == "weights.bin")
    assert sibling.size == 10**15 and sibling.lfs is not None and sibling.lfs.size == 10**15
    tree = {e.path: e for e in api.list_repo_tree(REPO) if isinstance(e, RepoFile)}
    assert tree["weights.bin"].size == 10**15
    with httpx2.Client() as client:
        url = f"{hub.endpoint}/{REPO}/resolve/main/weights.bin"
        assert client.head(url).headers["X-Linked-Size"] == str(10**15)
        assert client.get(url).status_code == 500

    evil_repo = "acme/evil"
    hub.add_commit(evil_repo, {"config.json": b"{}"})
    hub.add_raw_sibling(evil_repo, "../evil.txt", b"evil")
    hub.add_raw_sibling(evil_repo, "/etc/evil", b"evil")
    info = api.model_info(evil_repo, files_metadata=True)
    assert info.siblings is not None
    assert {s.rfilename for s in info.siblings} == {"config.json", "../evil.txt", "/etc/evil"}
    assert {"../evil.txt", "/etc/evil"} <= {e.path for e in api.list_repo_tree(evil_repo, recursive=True)}
    with pytest.raises(ValueError, match="Invalid filename"):  # huggingface_hub rejects the names itself
        snapshot_download(evil_repo, cache_dir=tmp_path / "b", endpoint=hub.endpoint)
    assert not (tmp_path / "evil.txt").exists()


def test_lfs_redirect_mode_and_bare_repo_id(tmp_path: Path) -> None:
    """With lfs_redirect=True LFS files are fetched from the 'CDN' origin; bare repo ids work."""
    data = random.Random(2).randbytes(4096)
    with LocalHub(lfs_redirect=True) as hub:
        sha = hub.add_commit("tiny", {"model.safetensors": data, "config.json": b"{}"})
        assert HfApi(endpoint=hub.endpoint).model_info("tiny").sha == sha
        folder = Path(snapshot_download("tiny", cache_dir=tmp_path, endpoint=hub.endpoint))
        assert (folder / "model.safetensors").read_bytes() == data
        assert (folder / "config.json").read_bytes() == b"{}"
        assert any(m == "GET" and p.startswith("/cdn-lfs/") for m, p, _ in hub.requests)
