"""`mreg pull` against a real huggingface_hub client and a local hub server on loopback."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.hub_server import LocalHub
from support.tiny_models import random_safetensors


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    """A local hub on 127.0.0.1, stopped after the test."""
    with LocalHub() as h:
        yield h


def files(seed: int = 0, weights: int = 4096) -> dict[str, bytes]:
    """A small model repository."""
    rnd = random.Random(seed)
    return {
        "config.json": b'{"model_type": "llama", "seed": %d}' % seed,
        "tokenizer.json": b'{"model": {"type": "BPE"}}',
        "model.safetensors": random_safetensors(weights, rnd.randrange(1 << 30)),
        "README.md": b"# tiny\n",
    }


def get_paths(hub: LocalHub) -> list[str]:
    """The file paths fetched with GET /resolve/."""
    return [p.split("/resolve/", 1)[1] for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]


def test_pull_pins_the_commit_and_verifies(mreg: Any, hub: LocalHub, cache_root: Path) -> None:
    commit = hub.add_commit("org/tiny", files())
    r = mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 0, r.stderr
    doc = r.json
    assert doc["commit"] == commit and doc["revision"] == "main" and doc["files"] == 4
    assert doc["cache_dir"] == str(cache_root) and doc["from_cache"] is False
    snap = Path(doc["snapshot"])
    assert snap == cache_root / "models--org--tiny" / "snapshots" / commit
    for name, data in files().items():
        assert (snap / name).read_bytes() == data
    human = mreg("pull", "org/tiny", "--endpoint", hub.endpoint)
    assert str(cache_root) in human.stdout and commit[:12] in human.stdout


def test_pin_by_commit_and_repull_without_network(mreg: Any, hub: LocalHub) -> None:
    first = hub.add_commit("org/tiny", files(0))
    second = hub.add_commit("org/tiny", files(1))
    assert mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--json").json["commit"] == second
    doc = mreg("pull", f"org/tiny@{first}", "--endpoint", hub.endpoint, "--json").json
    assert doc["commit"] == first
    assert (Path(doc["snapshot"]) / "config.json").read_bytes() == files(0)["config.json"]
    hub.reset_counters()
    again = mreg("pull", f"org/tiny@{first}", "--endpoint", hub.endpoint, "--json").json
    assert again["from_cache"] is True and hub.requests == [] and hub.bytes_sent == 0
    hub.stop()
    offline = mreg("pull", "org/tiny", "--offline", "--json").json
    assert offline["commit"] == second, "--offline serves the branch from the cached ref"
    assert mreg("pull", f"org/tiny@{first}", "--endpoint", hub.endpoint, "--json").json["commit"] == first
    fallback = mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--json")
    assert fallback.exit_code == 0 and fallback.json["commit"] == second, "unreachable hub: cached ref serves"


def test_offline_miss_and_unreachable_hub(mreg: Any, hub: LocalHub) -> None:
    r = mreg("pull", "org/never", "--offline")
    assert r.exit_code == 3 and "not in the cache" in r.stderr and "without --offline" in r.stderr
    endpoint = hub.endpoint
    hub.stop()
    r = mreg("pull", "org/never", "--endpoint", endpoint, "--json")
    assert r.exit_code == 9 and r.json["error"]["type"] == "HubUnavailable"


def test_unknown_repo_and_revision(mreg: Any, hub: LocalHub) -> None:
    hub.add_commit("org/tiny", files())
    r = mreg("pull", "org/missing", "--endpoint", hub.endpoint)
    assert r.exit_code == 3 and "does not exist" in r.stderr and "HF_TOKEN" in r.stderr
    r = mreg("pull", "org/tiny@nope", "--endpoint", hub.endpoint)
    assert r.exit_code == 3 and "revision 'nope'" in r.stderr
    assert mreg("pull", "bad repo id!", "--endpoint", hub.endpoint).exit_code == 8


@pytest.mark.slow
def test_dropped_connection_is_resumed_with_a_range_request(mreg: Any, hub: LocalHub) -> None:
    big = random.Random(3).randbytes(12 << 20)
    hub.add_commit("org/big", {"config.json": b"{}", "model.safetensors": big})
    hub.drop_connection_after("org/big", "model.safetensors", 11 << 20)
    r = mreg("pull", "org/big", "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 0, r.stderr
    ranges = [h.get("Range") for m, p, h in hub.requests if m == "GET" and p.endswith("model.safetensors")]
    assert ranges[0] is None and ranges[-1] is not None and ranges[-1].startswith("bytes=")
    assert (Path(r.json["snapshot"]) / "model.safetensors").read_bytes() == big


def test_interrupted_pull_resumes_without_refetching(mreg: Any, hub: LocalHub, cache_root: Path) -> None:
    hub.add_commit("org/tiny", files())
    hub.drop_connection_after("org/tiny", "tokenizer.json", 3, reset=True)
    r = mreg("pull", "org/tiny", "--endpoint", hub.endpoint)
    assert r.exit_code == 9 and "tokenizer.json" in r.stderr and "run the same pull again" in r.stderr
    snaps = list((cache_root / "models--org--tiny" / "snapshots").iterdir())
    done_first = {p.name for p in snaps[0].iterdir() if p.exists()} if snaps else set()
    assert "tokenizer.json" not in done_first
    hub.reset_counters()
    r = mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 0
    refetched = {p.split("/", 1)[1] for p in get_paths(hub)}
    assert "tokenizer.json" in refetched
    assert not (refetched & done_first), "files completed by the interrupted pull are not fetched again"


def test_corrupt_file_is_refused_and_removed(mreg: Any, hub: LocalHub, cache_root: Path) -> None:
    commit = hub.add_commit("org/tiny", files())
    hub.corrupt("org/tiny", "model.safetensors")
    r = mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 4
    err = r.json["error"]
    assert "model.safetensors is corrupt" in err["message"] and "sha256" in err["message"]
    snap = cache_root / "models--org--tiny" / "snapshots" / commit
    assert not (snap / "model.safetensors").exists() and not (snap / "model.safetensors").is_symlink()
    assert not list((cache_root / ".mreg").rglob("*.json")), "no pull record for a failed pull"
    hub.add_commit("org/small", files())
    hub.corrupt("org/small", "config.json")  # a small (non-LFS) file is checked by its git blob id
    r = mreg("pull", "org/small", "--endpoint", hub.endpoint, "--include", "*.json")
    assert r.exit_code == 4 and "config.json is corrupt" in r.stderr and "git blob id" in r.stderr


@pytest.mark.parametrize("bad", ["../evil.txt", "/tmp/mreg-evil-abs", "a/../../evil2"])
def test_path_traversal_is_refused(mreg: Any, hub: LocalHub, cache_root: Path, tmp_path: Path, bad: str) -> None:
    hub.add_commit("org/evil", files())
    hub.add_raw_sibling("org/evil", bad, b"pwned")
    before = set(tmp_path.parent.iterdir())
    r = mreg("pull", "org/evil", "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 8
    assert "escape the cache" in r.json["error"]["message"] and repr(bad) in r.json["error"]["message"]
    assert get_paths(hub) == [], "nothing was downloaded"
    assert set(tmp_path.parent.iterdir()) == before
    assert not Path("/tmp/mreg-evil-abs").exists()
    assert not [p for p in cache_root.rglob("*") if p.is_file()]


def test_pickle_only_repo_is_refused(mreg: Any, hub: LocalHub) -> None:
    hub.add_commit("org/pickled", {"config.json": b"{}", "pytorch_model.bin": b"\x80\x04pickle"})
    r = mreg("pull", "org/pickled", "--endpoint", hub.endpoint)
    assert r.exit_code == 8 and "only pickle weights" in r.stderr and "--allow-pickle" in r.stderr
    assert get_paths(hub) == []
    r = mreg("pull", "org/pickled", "--endpoint", hub.endpoint, "--allow-pickle", "--json")
    assert r.exit_code == 0 and r.json["files"] == 2


def test_pickle_files_are_skipped_beside_safetensors(mreg: Any, hub: LocalHub) -> None:
    hub.add_commit("org/both", {**files(), "pytorch_model.bin": b"\x80\x04pickle", "x.pt": b"p"})
    doc = mreg("pull", "org/both", "--endpoint", hub.endpoint, "--json").json
    assert sorted(doc["skipped"]) == ["pytorch_model.bin", "x.pt"] and doc["files"] == 4
    assert not any(p.endswith((".bin", ".pt")) for p in get_paths(hub))


def test_include_exclude(mreg: Any, hub: LocalHub) -> None:
    hub.add_commit("org/tiny", files())
    doc = mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--include", "*.json", "--exclude", "tok*",
               "--json").json
    assert doc["files"] == 1 and sorted(doc["skipped"]) == ["README.md", "model.safetensors", "tokenizer.json"]
    doc = mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--json").json
    assert doc["files"] == 4 and doc["from_cache"] is False, "a wider selection fetches the rest"


def test_free_space_is_checked_before_the_first_byte(mreg: Any, hub: LocalHub) -> None:
    hub.add_commit("org/huge", files())
    hub.announce_size("org/huge", "model.safetensors", 10**15)
    r = mreg("pull", "org/huge", "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 7
    msg = r.json["error"]["message"]
    assert "needs 909.5 TiB" in msg and "free" in msg
    assert get_paths(hub) == []


def test_convert_from_the_hub(mreg: Any, hub: LocalHub) -> None:
    commit = hub.add_commit("org/tiny", files())
    r = mreg("convert", "org/tiny", "--to", "hf", "--name", "tiny", "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json["source"] == {"repo": "org/tiny", "commit": commit}
    hub.stop()
    again = mreg("convert", f"org/tiny@{commit}", "--to", "hf", "--name", "tiny", "--json")
    assert again.exit_code == 0 and again.json["reused"] is True, "cached commit + same key: no network, no work"


@pytest.mark.parametrize("target", ["gguf:Q8_0", "onnx", "tensorrt:target=sm_89"])
def test_an_unsupported_architecture_is_refused_before_the_weights_download(mreg: Any, hub: LocalHub,
                                                                            target: str) -> None:
    """Only config.json is fetched; the converter (or, for TensorRT, the ONNX export it needs) names the
    architecture and what it supports; nothing is published."""
    pytest.importorskip("gguf" if target.startswith("gguf") else "onnx")
    repo = files()
    repo["config.json"] = b'{"architectures": ["MambaForCausalLM"], "model_type": "mamba"}'
    hub.add_commit("org/mamba", repo)
    r = mreg("convert", "org/mamba", "--to", target, "--name", "m", "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 2, r.stdout + r.stderr
    error = r.json["error"]
    assert "not supported by --to" in error["message"] and "supported:" in error["hint"]
    assert ("MambaForCausalLM" if target.startswith("gguf") else "mamba") in error["message"]
    assert [p.rsplit("/", 1)[-1] for p in get_paths(hub)] == ["config.json"], "no weight was downloaded"


def test_a_type_that_needs_an_importance_matrix_is_refused_before_the_weights_download(mreg: Any,
                                                                                    hub: LocalHub) -> None:
    """gguf:IQ2_M without --calibration or --imatrix: judged from config.json alone (exit 2, the hint names both
    flags), the weights never requested; with --calibration the same source goes on to download."""
    pytest.importorskip("gguf")
    repo = files()
    repo["config.json"] = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                      "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                                      "num_hidden_layers": 32, "vocab_size": 32000}).encode()
    hub.add_commit("org/llama", repo)
    r = mreg("convert", "org/llama", "--to", "gguf:IQ2_M", "--name", "m", "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 2, r.stdout + r.stderr
    error = r.json["error"]
    assert "gguf:IQ2_M needs an importance matrix" in error["message"] and "--calibration" in error["hint"]
    assert [p.rsplit("/", 1)[-1] for p in get_paths(hub)] == ["config.json"], "no weight was downloaded"
    r = mreg("convert", "org/llama", "--to", "gguf:IQ2_M", "--calibration", "default", "--name", "m",
             "--endpoint", hub.endpoint, "--json")
    assert r.exit_code != 0 and "model.safetensors" in [p.rsplit("/", 1)[-1] for p in get_paths(hub)]


def test_local_directory_import(mreg: Any, model_dir: Path, tmp_path: Path) -> None:
    a = mreg("pull", model_dir, "--json").json
    b = mreg("pull", f"file://{model_dir}", "--json").json
    assert a["kind"] == "local" and a["commit"] == b["commit"] and a["files"] == 2
    (model_dir / "evil").symlink_to("/etc/passwd")
    r = mreg("pull", model_dir)
    assert r.exit_code == 8 and "outside" in r.stderr
    os.unlink(model_dir / "evil")
    (model_dir / "weights.ckpt").write_bytes(b"x")
    os.unlink(model_dir / "model.safetensors")
    assert mreg("pull", model_dir).exit_code == 8
    assert mreg("pull", tmp_path / "nope").exit_code == 3


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", ["llama", "bert", "llama-sharded"])
def test_tiny_models_round_trip_through_hub_cache_and_store(mreg: Any, hub: LocalHub, tmp_path: Path,
                                                            kind: str) -> None:
    from support.tiny_models import build_tiny_bert, build_tiny_llama

    src = tmp_path / kind
    if kind == "bert":
        build_tiny_bert(src)
    else:
        build_tiny_llama(src, shards=2 if kind.endswith("sharded") else 1)
    tree = _tree(src)
    commit = hub.add_commit(f"tiny/{kind}", tree)
    r = mreg("convert", f"tiny/{kind}", "--to", "hf", "--name", kind, "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json["source"]["commit"] == commit
    mreg("promote", f"{kind}@1")
    mount = Path(mreg("resolve", f"{kind}@production", "--json").json["path"])
    assert _tree(mount) == tree, "what an engine mounts is byte-identical to the repository"
    assert any(p.endswith(".safetensors") for p in tree) and "tokenizer.json" in tree


def test_unchanged_local_directory_is_not_read_again(mreg: Any, model_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.cache import local

    monkeypatch.setattr(local, "RACY_S", 0.2)
    time.sleep(0.25)  # past the racy window: a write from now on moves ctime
    first = mreg("pull", model_dir, "--json").json
    again = mreg("pull", model_dir, "--json").json
    assert first["from_cache"] is False and again["from_cache"] is True and again["commit"] == first["commit"]
    (model_dir / "config.json").write_text('{"changed": 1}')
    changed = mreg("pull", model_dir, "--json").json
    assert changed["from_cache"] is False and changed["commit"] != first["commit"]


def test_a_directory_link_out_of_the_tree_is_refused_and_a_linked_source_is_its_target(
        mreg: Any, model_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    (model_dir / "extra").symlink_to(outside, target_is_directory=True)
    r = mreg("pull", model_dir, "--json")
    assert r.exit_code == 8 and "outside" in r.json["error"]["message"], "it was skipped silently"
    (model_dir / "extra").unlink()
    via = tmp_path / "via-link"
    via.symlink_to(model_dir, target_is_directory=True)
    linked = mreg("pull", via, "--json")
    assert linked.exit_code == 0, linked.stderr  # was refused: its files "escaped" the link's path
    assert linked.json["commit"] == mreg("pull", model_dir, "--json").json["commit"]


def test_the_cache_folder_is_named_as_huggingface_hub_names_it() -> None:
    """mreg spells out huggingface_hub's folder name (importing hub for it cost a local pull 0.19 s)."""
    from huggingface_hub.file_download import repo_folder_name

    from registry.layout import cache_repo_folder

    for repo in ("gpt2", "org/name", "local/tinyllama-6e2b49c5", "Qwen/Qwen2.5-0.5B-Instruct", "a-b/c.d_e"):
        assert cache_repo_folder(repo) == repo_folder_name(repo_id=repo, repo_type="model")
