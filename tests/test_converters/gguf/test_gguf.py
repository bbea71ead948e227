"""`mreg convert --to gguf:TYPE`: registered versions, the file llama.cpp reads, clear refusals."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert, integrity_refusal
from support.llama_cpp_source import field
from support.tiny_models import set_value

gguf = pytest.importorskip("gguf")


def _convert(mreg: Any, src: Path, spec: str, name: str = "m") -> dict[str, Any]:
    return convert(mreg, src, f"gguf:{spec}", name)


def _version(store_root: Path, name: str, number: int) -> tuple[dict[str, Any], Path]:
    """The gguf artifact of a version and the path of its one file."""
    art, tree = artifact(store_root, name, number, "gguf")
    (entry,) = art["files"]
    return art, tree / entry["path"]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral", "qwen3", "llama-spm", "llama3-rope"])
@pytest.mark.slow
def test_each_architecture_converts_loads_and_tokenizes_like_hf(
        kind: str, mreg: Any, store_root: Path, tiny_model: Callable[..., Path]) -> None:
    src = tiny_model(kind)
    doc = _convert(mreg, src, "Q8_0")
    assert doc["verification"] == {"gguf": "passed"}
    art, path = _version(store_root, "m", doc["version"])
    assert path.name == "m-Q8_0.gguf", "named after the model in the store"
    arch = {"qwen2": "qwen2", "qwen3": "qwen3"}.get(kind, "llama")
    assert art["requirements"]["architecture"] == arch and art["requirements"]["quantization"] == "Q8_0"
    assert art["options"]["type"] == "Q8_0" and "gguf" in art["tool_versions"]
    # A quantized type's quality is measured on the shipped evaluation text by default (its digest in the key).
    assert art["options"]["evaluation"]["text"] == "default" and art["options"]["evaluation"]["max_tokens"] == 32
    metrics = art["verification"]["metrics"]
    assert metrics["evaluation_tokens"] == metrics["logits_positions"] == 32 and "perplexity_ratio" in metrics
    assert metrics["llama_cpp_loaded"] == 1.0, "llama.cpp loads the file (llama-cpp-python is in the test extra)"
    assert metrics["tokenization_mismatches"] == 0.0 and metrics["tokenization_strings"] >= 5
    reader = gguf.GGUFReader(path)
    assert field(reader, "general.architecture") == arch
    assert field(reader, "tokenizer.ggml.model") == ("llama" if kind == "llama-spm" else "gpt2")
    assert "tokenizer.chat_template" in reader.fields
    counts = art["requirements"]["tensor_types"]
    assert set(counts) == {"F32", "Q8_0"} and sum(counts.values()) == len(reader.tensors)
    if kind == "llama3-rope":
        freqs = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        assert freqs.tensor_type.name == "F32" and list(freqs.shape) == [8], "one factor per rotary pair"


def test_metadata_carries_what_llama_cpp_reads(mreg: Any, store_root: Path, tiny_model: Callable[..., Path]) -> None:
    src = tiny_model("qwen3", head_dim=32, hidden=64, heads=4, kv_heads=2, tied=True)
    doc = _convert(mreg, src, "F16")
    _, path = _version(store_root, "m", doc["version"])
    r = gguf.GGUFReader(path)
    config = json.loads((src / "config.json").read_text())
    assert field(r, "qwen3.block_count") == config["num_hidden_layers"]
    assert field(r, "qwen3.attention.head_count") == 4 and field(r, "qwen3.attention.head_count_kv") == 2
    assert field(r, "qwen3.attention.key_length") == 32, "head_dim differs from hidden / heads"
    assert field(r, "qwen3.rope.freq_base") == pytest.approx(config["rope_theta"])
    assert field(r, "qwen3.context_length") == config["max_position_embeddings"]
    assert field(r, "tokenizer.ggml.pre") == "gpt-2"
    assert field(r, "tokenizer.ggml.eos_token_id") == config["eos_token_id"]
    assert field(r, "general.file_type") == 1
    names = {t.name for t in r.tensors}
    assert "output.weight" not in names, "tied embeddings: llama.cpp reuses token_embd"
    assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= names
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.0.attn_q.weight"] == "F16"


def test_llama_bos_flag_and_untied_output(mreg: Any, store_root: Path, tiny_model: Callable[..., Path]) -> None:
    src = tiny_model("llama")
    _, path = _version(store_root, "m", _convert(mreg, src, "Q4_K_M")["version"])
    r = gguf.GGUFReader(path)
    assert field(r, "tokenizer.ggml.add_bos_token") is True and field(r, "tokenizer.ggml.bos_token_id") == 1
    assert field(r, "llama.rope.dimension_count") == 16
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert "output.weight" in types


def test_fallbacks_are_recorded(mreg: Any, store_root: Path, tiny_model: Callable[..., Path]) -> None:
    src = tiny_model("llama", hidden_size=96, num_heads=3, num_kv_heads=1, intermediate_size=160)
    art, _ = _version(store_root, "m", _convert(mreg, src, "Q4_K_M")["version"])
    fallbacks = art["requirements"]["fallbacks"]
    assert fallbacks["blk.0.attn_q.weight"].startswith("Q4_K->Q5_0")
    assert fallbacks["blk.1.ffn_down.weight"].startswith("Q6_K->Q8_0"), "last layer: more bits, 160 columns"
    assert "96 columns" in fallbacks["blk.0.ffn_up.weight"]
    assert "token_embd.weight" in fallbacks


def test_the_encoder_of_each_type_is_recorded(mreg: Any, store_root: Path, tiny_model: Callable[..., Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`gguf-encoders` names, per type written, the encoder that wrote it: mreg's kernels for the K-quants where
    they are built, numpy's copy for F32; MREG_GGUF_QUANTIZER=ggml forces llama.cpp's."""
    from converters.gguf import quants

    src = tiny_model("llama", hidden_size=256, num_heads=4, num_kv_heads=1, intermediate_size=256)
    art, _ = _version(store_root, "m", _convert(mreg, src, "Q4_K_M")["version"])
    kernel = "native" if quants.native_available() else "ggml"
    assert art["tool_versions"]["gguf-encoders"] == f"F32=numpy,Q4_K={kernel},Q6_K={kernel}"
    monkeypatch.setenv("MREG_GGUF_QUANTIZER", "ggml")
    art, _ = _version(store_root, "m", _convert(mreg, src, "Q4_K_S")["version"])
    assert art["tool_versions"]["gguf-encoders"] == "F32=numpy,Q4_K=ggml,Q5_K=ggml,Q6_K=ggml"


@pytest.mark.slow
def test_same_conversion_is_reused_and_types_make_versions(mreg: Any, tiny_model: Callable[..., Path]) -> None:
    src = tiny_model("qwen2")
    first = _convert(mreg, src, "q8_0")
    again = _convert(mreg, src, "Q8_0")
    assert again["version"] == first["version"] and again["reused"] is True
    other = _convert(mreg, src, "Q4_0")
    assert other["version"] == first["version"] + 1 and other["reused"] is False


def test_unknown_type_lists_the_valid_ones(mreg: Any, tiny_model: Callable[..., Path], store_root: Path) -> None:
    r = mreg("convert", tiny_model("llama"), "--to", "gguf:Q9_X", "--name", "m")
    assert r.exit_code == 2 and "Q9_X" in r.stderr and "Q4_K_M" in r.stderr and "Q8_0" in r.stderr
    assert not (store_root / "models" / "m").exists()


def _nothing_published(store_root: Path) -> bool:
    tmp = store_root / "tmp"
    return not (store_root / "models" / "m" / "versions").exists() and (not tmp.exists() or not any(tmp.iterdir()))


def test_unsupported_architecture_is_refused_before_output(mreg: Any, tiny_model: Callable[..., Path],
                                                           store_root: Path) -> None:
    src = tiny_model("llama")
    config = json.loads((src / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (src / "config.json").write_text(json.dumps(config))
    r = mreg("convert", src, "--to", "gguf:Q8_0", "--name", "m", "--json")
    assert r.exit_code == 2 and "GPT2LMHeadModel" in r.json["error"]["message"]
    assert "Qwen2ForCausalLM" in r.stderr, "the hint names the supported architectures"
    assert _nothing_published(store_root)


def test_unsupported_tokenizer_is_refused_before_output(mreg: Any, tiny_model: Callable[..., Path],
                                                        store_root: Path) -> None:
    src = tiny_model("llama")
    doc = json.loads((src / "tokenizer.json").read_text())
    doc["pre_tokenizer"] = {"type": "Whitespace"}
    (src / "tokenizer.json").write_text(json.dumps(doc))
    r = mreg("convert", src, "--to", "gguf:F16", "--name", "m")
    assert r.exit_code == 2 and "pre_tokenizer" in r.stderr and "Whitespace" in r.stderr
    assert _nothing_published(store_root)


def test_a_failed_check_fails_the_conversion(mreg: Any, tiny_model: Callable[..., Path], store_root: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from converters.gguf import verify as gguf_verify
    monkeypatch.setitem(gguf_verify.ERROR_BOUND, "Q8_0", 0.0)
    r = mreg("convert", tiny_model("llama"), "--to", "gguf:Q8_0", "--name", "m", "--json")
    assert r.exit_code == 4 and "relative RMS error" in r.json["error"]["message"]
    assert _nothing_published(store_root)


#: A row of the tiny llama's (128 x 64) up projection that no encoding-error sample reads (those are 0, 32, 64, 96).
UNSAMPLED = 5 * 64 + 3


@pytest.mark.parametrize("spec", ["F16", "Q8_0"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.slow
def test_a_nan_or_inf_weight_fails_and_publishes_nothing(spec: str, value: float, mreg: Any,
                                                         tiny_model: Callable[..., Path], store_root: Path) -> None:
    src = set_value(tiny_model("llama"), "model.layers.1.mlp.up_proj.weight", UNSAMPLED, value)
    r = mreg("convert", src, "--to", f"gguf:{spec}", "--name", "m", "--json")
    err = integrity_refusal(r, store_root, "m", "source tensor model.layers.1.mlp.up_proj.weight (blk.1.ffn_up.weight) "
                                                "has 1 NaN/Inf value")
    record = err["details"]["verification"]
    assert record["status"] == "failed" and record["metrics"]["source_nonfinite"] == 1.0
    assert record["tolerance"]["source_nonfinite"] == 0.0


def test_a_finite_weight_past_f16_range_fails_as_written(mreg: Any, tiny_model: Callable[..., Path],
                                                         store_root: Path) -> None:
    """1e5 is a finite float32 but Inf in F16: the written tensor is judged, not only its source."""
    src = set_value(tiny_model("llama"), "model.layers.1.mlp.up_proj.weight", UNSAMPLED, 1e5)
    r = mreg("convert", src, "--to", "gguf:F16", "--name", "m", "--json")
    err = integrity_refusal(r, store_root, "m", "tensor model.layers.1.mlp.up_proj.weight (blk.1.ffn_up.weight) "
                                                "written as F16 has 1 NaN/Inf value")
    assert "source tensor" not in err["message"] and err["details"]["verification"]["metrics"]["encoded_nonfinite"] == 1


def test_help_imports_no_heavy_library() -> None:
    code = textwrap.dedent("""
        import sys
        from click.testing import CliRunner
        from registry.cli import main
        from registry.convert import formats
        formats.get("gguf")
        CliRunner().invoke(main, ["convert", "--help"])
        heavy = [m for m in ("llama_cpp", "torch", "transformers", "tokenizers", "sentencepiece") if m in sys.modules]
        print(",".join(heavy))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _peak_rss_mb(src: Path, out: Path) -> float:
    code = textwrap.dedent(f"""
        import resource, sys
        from converters.gguf.converter import write
        from converters.gguf.plan import plan
        from converters.gguf.model import SafetensorsReader
        from pathlib import Path
        src = Path({str(src)!r})
        p = plan(src, sorted(src.glob("*.safetensors")), "Q8_0", "m")
        write([p], [Path({str(out)!r})], SafetensorsReader(), workers=2)
        from converters.gguf.reference import reference_logits
        reference_logits(src, list(range(1, 17)))  # the verification's float32 forward pass streams too
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_model(tmp_path: Path) -> None:
    from support.tiny_models import build_padded_model

    small = build_padded_model(tmp_path / "small", 40 * 10**6, shard_bytes=20 * 10**6)
    large = build_padded_model(tmp_path / "large", 200 * 10**6, shard_bytes=100 * 10**6)
    rss_small = _peak_rss_mb(small, tmp_path / "small.gguf")
    rss_large = _peak_rss_mb(large, tmp_path / "large.gguf")
    assert rss_large - rss_small < 40, f"peak RSS {rss_small:.0f} MB -> {rss_large:.0f} MB for 5x the weights"


@pytest.mark.slow
def test_several_types_share_one_read_and_match_separate_runs(mreg: Any, store_root: Path, tmp_path: Path,
                                                              tiny_model: Callable[..., Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`--to gguf:F16 --to gguf:Q8_0 --to gguf:Q4_K_M` reads each chunk of the source once, for all three files."""
    from converters.gguf import model as gguf_model

    reads: list[tuple[str, int]] = []
    real = gguf_model.SafetensorsReader.rows

    def counted(self: Any, t: Any, start: int, stop: int) -> Any:
        reads.append((t.name, start))
        return real(self, t, start, stop)

    monkeypatch.setattr(gguf_model.SafetensorsReader, "rows", counted)
    src = tiny_model("llama")
    r = mreg("convert", src, "--to", "gguf:F16", "--to", "gguf:Q8_0", "--to", "gguf:Q4_K_M", "--name", "m", "--json")
    assert r.exit_code == 0, r.stderr + r.stdout
    assert reads and len(reads) == len(set(reads)), "every chunk of every tensor is read once"
    arts = mreg("show", f"m@{r.json['version']}", "--json").json["manifest"]["artifacts"]
    assert [a["options"]["type"] for a in arts] == ["F16", "Q8_0", "Q4_K_M"]
    together = {a["options"]["type"]: a for a in arts}
    assert all(a["verification"]["status"] == "passed" for a in arts)
    assert {a["verification"]["metrics"]["files_written_together"] for a in arts} == {3.0}
    for spec in ("F16", "Q4_K_M"):
        other = tmp_path / f"alone-{spec}"  # the same model name (it is in the file's metadata), another store
        one = mreg("convert", src, "--to", f"gguf:{spec}", "--name", "m", "--store", other, "--json")
        assert one.exit_code == 0, one.stderr
        art, _ = _version(other, "m", one.json["version"])
        assert art["files"][0]["sha256"] == together[spec]["files"][0]["sha256"], f"{spec}: same bytes"


def test_rope_parameters_as_transformers_5_writes_them(mreg: Any, store_root: Path,
                                                        tiny_model: Callable[..., Path]) -> None:
    """A config saved by transformers 5 (`rope_parameters`) gives llama.cpp the same rope base and scaling."""
    src = tiny_model("llama")
    config = json.loads((src / "config.json").read_text())
    config.pop("rope_theta", None), config.pop("rope_scaling", None)
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 20000.0}
    (src / "config.json").write_text(json.dumps(config))
    doc = _convert(mreg, src, "F16")
    art, path = _version(store_root, "m", doc["version"])
    r = gguf.GGUFReader(path)
    assert field(r, "llama.rope.freq_base") == pytest.approx(20000.0)
    assert field(r, "llama.rope.scaling.type") == "linear" and field(r, "llama.rope.scaling.factor") == 2.0
    assert art["verification"]["status"] == "passed" and "kl_divergence" in art["verification"]["metrics"]


def test_a_type_given_twice_is_refused_before_any_work(mreg: Any, store_root: Path,
                                                      tiny_model: Callable[..., Path]) -> None:
    r = mreg("convert", tiny_model("llama"), "--to", "gguf:Q8_0", "--to", "gguf:q8_0", "--name", "m", "--json")
    assert r.exit_code == 2 and "given twice" in r.json["error"]["message"]
    assert not (store_root / "models" / "m").exists()


def test_a_short_read_is_refused_not_zero_filled(tmp_path: Path) -> None:
    import numpy as np

    from converters.gguf.model import UnsupportedModel, pread_exact

    path = tmp_path / "short.safetensors"
    path.write_bytes(bytes(range(10)))
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = np.empty(4, np.uint16)
        pread_exact(fd, buf, 2)
        assert bytes(buf.data) == bytes(range(2, 10))
        with pytest.raises(UnsupportedModel, match="shorter than its header"):
            pread_exact(fd, np.empty(4, np.uint16), 4)
    finally:
        os.close(fd)


def test_a_billion_layers_stays_under_a_memory_limit(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    """Before the check the plan alone (a tensor name per layer) ran out of memory or crashed the process."""
    import resource

    src = tiny_model("llama")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10**9}))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    env = {**os.environ, "MREG_CACHE_DIR": str(tmp_path / "c"), "MREG_STORE": str(tmp_path / "s")}
    r = subprocess.run([str(Path(sys.executable).parent / "mreg"), "convert", str(src), "--to", "gguf:F16",
                        "--name", "m", "--json"], env=env, capture_output=True, text=True, timeout=120,
                       preexec_fn=limit)
    assert r.returncode == 4, r.stderr[-2000:]
    assert json.loads(r.stdout)["error"]["type"] == "InconsistentModel"


def test_a_conversion_writes_nothing_to_the_system_temp_dir(mreg: Any, tiny_model: Callable[..., Path],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work files live in the staging tree, on the store's filesystem: a killed run leaves nothing outside."""
    import tempfile

    nowhere = tmp_path / "not-a-directory"
    nowhere.write_text("")  # nothing can be made inside it, root or not
    monkeypatch.setattr(tempfile, "tempdir", str(nowhere))
    r = mreg("convert", tiny_model("llama"), "--to", "gguf:Q8_0", "--name", "m", "--json")
    assert r.exit_code == 0, r.stderr


#: The property test's bounds: seeds, the address-space limit of the process that runs mreg, each seed's wall time.
SEEDS, MEMORY_LIMIT, SEED_SECONDS = 200, 3 << 30, 30.0


@pytest.mark.slow
def test_random_damage_never_tracebacks_hangs_or_publishes_a_failed_version(
        tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    """Property: 200 random mutations of the header bytes and of config.json values, converted by mreg in a child
    process limited to 3 GiB of address space (RLIMIT_AS); every run ends within its bound with a known exit code,
    a JSON document and a hint, never a traceback or a MemoryError, and any version published passed, verifies
    and was made from a file the safetensors library itself reads."""
    import resource
    import selectors
    import time

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    tests = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MREG_CACHE_DIR": str(tmp_path / "c"), "MREG_STORE": str(tmp_path / "s"),
           "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent), os.environ.get("PYTHONPATH", "")]),
           "MALLOC_ARENA_MAX": "2"}
    child = subprocess.Popen([sys.executable, "-m", "support.mutations", str(tiny_model("llama")), "0", str(SEEDS)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    assert child.stdout is not None and child.stderr is not None
    reports: list[dict[str, Any]] = []
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(child.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + SEED_SECONDS
            while len(reports) < SEEDS:
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    pytest.fail(f"seed {len(reports)} ran past {SEED_SECONDS} s")
                line = child.stdout.readline()
                if not line:
                    err = child.stderr.read()
                    pytest.fail(f"the child died at seed {len(reports)} (exit {child.wait()}): {err[-3000:]}")
                reports.append(json.loads(line))
                deadline = time.monotonic() + SEED_SECONDS
    finally:
        child.kill()
        child.wait()
    assert "MemoryError" not in child.stderr.read()
    codes: dict[int, int] = {}
    for r in reports:
        assert not r["traceback"] and r["json"], r
        assert r["exit"] in (0, 2, 4, 8), r
        if r["exit"] == 0:
            assert r["verification"] == "passed" and r["verify_exit"] == 0 and r["loadable"], r
        else:
            assert r["hint"], r
        codes[r["exit"]] = codes.get(r["exit"], 0) + 1
    assert codes.get(4, 0) > 50 and codes.get(0, 0) >= 10, codes  # the publish path is exercised too


def _poison(path: Path, tensor_suffix: str, value: float) -> str:
    """Put `value` (NaN or Inf) into one element of a tensor of a safetensors file; returns the tensor's name."""
    import struct

    import numpy as np

    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    name = next(k for k in sorted(header) if k.endswith(tensor_suffix))
    info = header[name]
    at = 8 + n + info["data_offsets"][0] + 2 * 17  # an element in the middle of the first row
    if info["dtype"] == "F32":
        at = 8 + n + info["data_offsets"][0] + 4 * 17
        data[at:at + 4] = np.float32(value).tobytes()
    elif info["dtype"] == "F16":
        data[at:at + 2] = np.float16(value).tobytes()
    else:  # BF16: the upper half of the float32
        data[at:at + 2] = np.float32(value).tobytes()[2:]
    path.write_bytes(bytes(data))
    return name


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("target", ["gguf:F16", "gguf:Q8_0"])
@pytest.mark.slow
def test_nan_or_inf_weights_fail_verification_and_name_the_tensor(mreg: Any, tiny_model: Callable[..., Path],
                                                                  store_root: Path, value: float,
                                                                  target: str) -> None:
    """A comparison with NaN is false: NaN weights were published as `passed` with null logits metrics."""
    src = tiny_model("llama")
    name = _poison(src / "model.safetensors", "layers.1.mlp.up_proj.weight", value)
    r = mreg("convert", src, "--to", target, "--name", "m", "--json")
    assert r.exit_code == 4, r.stderr
    assert r.json["error"]["type"] == "IntegrityError" and "NaN/Inf" in r.json["error"]["message"]
    assert "blk.1.ffn_up.weight" in r.json["error"]["message"], (name, r.json["error"]["message"])
    assert _nothing_published(store_root)


def test_a_full_disk_while_writing_is_exit_7_and_nothing_is_left(mreg: Any, tiny_model: Callable[..., Path],
                                                                 store_root: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from converters.gguf.file import HashingWriter

    def full(self: Any, data: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(HashingWriter, "write", full)
    r = mreg("convert", tiny_model("llama"), "--to", "gguf:Q8_0", "--name", "m", "--json")
    assert r.exit_code == 7 and r.json["error"]["type"] == "InsufficientSpace", r.stderr
    assert _nothing_published(store_root)
    assert not any((store_root / "tmp").glob("stage-*")), "the staging tree is gone"
