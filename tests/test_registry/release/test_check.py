"""Golden-set checks: expectations, baselines, context limits, records, and the promotion gate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from manifests import GoldenCase
from registry.errors import UsageError
from registry.release.check import evaluate, load_golden


def case(**expect: Any) -> GoldenCase:
    """A prompt case with these expectations."""
    return GoldenCase.model_validate({"id": "c", "prompt": "p", "expect": expect})


def judge(c: GoldenCase, output: str, **kw: Any) -> list[str]:
    """Failures of one output."""
    args = {"latency_ms": 10.0, "tokens_per_s": 50.0, "cosine": None, "baseline_output": None, **kw}
    return evaluate(c, output, **args)[0]


def test_keywords_count_hits_and_forbidden_words_fail() -> None:
    c = case(contains=["Paris", "France"], not_contains=["Berlin"])
    assert evaluate(c, "paris is nice", latency_ms=1, tokens_per_s=1, cosine=None, baseline_output=None) == (
        [], 1, 2)
    assert judge(c, "Paris, not Berlin") == ["contains forbidden 'Berlin'"]


def test_regex_json_and_schema() -> None:
    assert judge(case(regex=r"^\d{4}-\d{2}$"), "2026-11") == []
    assert judge(case(regex=r"^\d+$"), "abc") == ["does not match /^\\d+$/"]
    assert judge(case(json=True), ' {"a": 1} ') == []
    assert judge(case(json=True), "{a: 1}") == ["output is not JSON"]
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}}
    assert judge(case(json=schema), '{"answer": 42}') == []
    assert judge(case(json=schema), '{"answer": "x"}')[0].startswith("JSON does not match the schema")


def test_latency_throughput_cosine_and_baseline() -> None:
    assert judge(case(max_latency_ms=5), "x") == ["latency 10 ms > 5 ms"]
    assert judge(case(min_tokens_per_s=100), "x") == ["50.0 tokens/s < 100"]
    assert judge(case(min_cosine=0.99), "x", cosine=0.5) == ["cosine 0.5 < 0.99 (against the baseline)"]
    assert judge(case(min_cosine=0.99), "x", cosine=float("nan")), "a NaN embedding never passes"
    assert judge(case(), "new", baseline_output="old")[0].startswith("output differs from the baseline")
    assert judge(case(baseline=False), "new", baseline_output="old") == []


def test_golden_file_problems_are_collected(tmp_path: Path) -> None:
    g = tmp_path / "g.jsonl"
    g.write_text('{"id": "a", "prompt": "x"}\n{"id": "b"}\n{"id": "a", "text": "t", "prompt": "p"}\n'
                 '{"id": "d", "prompt": "x", "expect": {"contain": ["typo"]}}\n')
    with pytest.raises(UsageError) as e:
        load_golden(g)
    msg = str(e.value)
    assert "line 2:" in msg and "line 3:" in msg and "line 4:" in msg


def test_messages_are_passed_as_written_and_tools_need_messages(tmp_path: Path) -> None:
    """A message keeps the fields a template reads (tool calls, ids, reasoning); only the keys written reach it."""
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}], "reasoning_content": "why"}
    c = GoldenCase.model_validate({"id": "t", "messages": [{"role": "user", "content": "hi"}, call,
                                                         {"role": "tool", "tool_call_id": "1", "content": "2"}],
                                   "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert [m.template_input() for m in c.messages or ()] == [
        {"role": "user", "content": "hi"}, call, {"role": "tool", "tool_call_id": "1", "content": "2"}]
    g = tmp_path / "g.jsonl"
    g.write_text('{"id": "a", "prompt": "x", "tools": []}\n{"id": "b", "messages": []}\n'
                 '{"id": "c", "messages": [{"content": "no role"}]}\n')
    with pytest.raises(UsageError) as e:
        load_golden(g)
    msg = str(e.value)
    assert "line 1: Value error, tools go with messages" in msg and "line 2:" in msg and "line 3:" in msg


@pytest.fixture
def llama_versions(mreg: Any, tmp_path: Path) -> Path:
    """Model `tiny`: version 1 a tiny random llama, version 2 the same with one tensor tampered."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from support.tiny_models import build_tiny_llama

    src = build_tiny_llama(tmp_path / "llama", seed=3)
    assert mreg("convert", src, "--to", "hf", "--name", "tiny").exit_code == 0
    data = bytearray((src / "model.safetensors").read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    for i in range(header + 64, len(data) - 64, 97):  # damage weights, keep the header
        # Not a float32's top byte: its 0x40 is the exponent's top bit, which makes ~1.0 Inf or NaN (refused by
        # --to hf: tests/test_converters/hf); a mantissa bit damages the value as much and leaves it finite.
        data[i] ^= 0x40 if (i - header) % 4 != 3 else 0
    (src / "model.safetensors").write_bytes(bytes(data))
    assert mreg("convert", src, "--to", "hf", "--name", "tiny").exit_code == 0
    return src


def write_golden(path: Path, cases: list[dict[str, Any]]) -> Path:
    """A golden JSONL file."""
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    return path


@pytest.mark.slow
def test_baseline_catches_a_damaged_version_and_gates_promotion(mreg: Any, llama_versions: Path,
                                                               tmp_path: Path) -> None:
    golden = write_golden(tmp_path / "smoke.jsonl", [
        {"id": "hello", "prompt": "Hello, my name is", "max_new_tokens": 8},
        {"id": "chat", "messages": [{"role": "user", "content": "What is the capital of France?"}],
         "max_new_tokens": 8},
        {"id": "fast", "prompt": "The quick brown fox", "max_new_tokens": 4, "expect": {"max_latency_ms": 60000}},
    ])
    before = mreg("promote", "tiny@1", "--require", "check:smoke", "--json")
    assert before.exit_code == 6 and "no check of golden set 'smoke'" in before.json["error"]["message"]
    r = mreg("check", "tiny@1", "--golden", golden, "--record-baseline", "--json")
    assert r.exit_code == 0, r.stderr
    rec = r.json
    assert rec["passed"] is True and rec["runtime"] == "transformers" and rec["format"] == "hf"
    assert all(c["output_tokens"] > 0 and c["prompt_tokens"] > 0 for c in rec["cases"])
    assert rec["golden_sha256"] and rec["latency_p95_ms"] >= rec["latency_p50_ms"] > 0
    again = mreg("check", "tiny@1", "--golden", golden, "--json").json
    assert again["passed"] is True and again["baseline_from"] == 1, "greedy runs are repeatable"
    bad = mreg("check", "tiny@2", "--golden", golden, "--json")
    assert bad.exit_code == 11 and bad.json["passed"] is False
    assert any("differs from the baseline" in f for c in bad.json["cases"] for f in c["failures"])
    blocked = mreg("promote", "tiny@2", "--require", "check:smoke", "--json")
    assert blocked.exit_code == 6 and "the latest check of 'smoke' failed: hello" in blocked.json["error"]["message"]
    assert mreg("promote", "tiny@1", "--require", "check").exit_code == 0
    never = mreg("promote", "tiny@2", "--require", "check:other")
    assert never.exit_code == 6 and "no check of golden set 'other'" in never.stderr
    checks = sorted((tmp_path / "store/models/tiny/checks/1").glob("*.json"))
    assert len(checks) == 2, "every run is kept, append-only"


def test_context_limit_in_model_tokens(mreg: Any, llama_versions: Path, tmp_path: Path) -> None:
    manifest = mreg("show", "tiny@1", "--json").json["manifest"]
    assert manifest["model"]["context_length"] == 256 and manifest["model"]["tokenizer"]
    golden = write_golden(tmp_path / "long.jsonl", [
        {"id": "long", "prompt": "word " * 300, "max_new_tokens": 4},
        {"id": "short", "prompt": "word", "max_new_tokens": 4, "expect": {"max_latency_ms": 0.001}},
        {"id": "json", "prompt": "Answer in JSON:", "max_new_tokens": 4, "expect": {"json": {"type": "object"}}},
    ])
    r = mreg("check", "tiny@1", "--golden", golden, "--json")
    assert r.exit_code == 11
    long, short, as_json = r.json["cases"]
    assert long["prompt_tokens"] > 256 and "exceeds the model's context of 256 tokens" in long["failures"][0]
    assert short["failures"][0].startswith("latency")
    assert as_json["failures"] == ["output is not JSON"], "a random tiny model does not answer in JSON"


def test_keyword_hit_rate_over_the_set(mreg: Any, llama_versions: Path, tmp_path: Path) -> None:
    first = mreg("check", "tiny@1", "--golden", write_golden(tmp_path / "probe.jsonl", [
        {"id": "a", "prompt": "Once upon a time", "max_new_tokens": 6}]), "--json").json
    out = first["cases"][0]["output"]
    word = next(w for w in out.split() if w.strip())
    golden = write_golden(tmp_path / "kw.jsonl", [
        {"id": "a", "prompt": "Once upon a time", "max_new_tokens": 6,
         "expect": {"contains": [word, "zebra-not-there"], "regex": ".+"}}])
    half = mreg("check", "tiny@1", "--golden", golden, "--json")
    assert half.exit_code == 11 and half.json["keyword_hit_rate"] == 0.5
    ok = mreg("check", "tiny@1", "--golden", golden, "--min-hit-rate", "0.5", "--json")
    assert ok.exit_code == 0 and ok.json["passed"] is True


def test_encoder_embeddings_against_the_baseline(mreg: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from support.tiny_models import build_tiny_bert

    src = build_tiny_bert(tmp_path / "bert")
    assert mreg("convert", src, "--to", "hf", "--name", "enc").exit_code == 0
    golden = write_golden(tmp_path / "emb.jsonl", [{"id": "e", "text": "the cat sat on the mat",
                                                     "expect": {"min_cosine": 0.999}}])
    assert mreg("check", "enc@1", "--golden", golden, "--record-baseline").exit_code == 0
    r = mreg("check", "enc@1", "--golden", golden, "--json")
    assert r.exit_code == 0 and r.json["cases"][0]["cosine"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("fmt", ["gguf", "onnx"])
@pytest.mark.slow
def test_check_runs_gguf_and_onnx_artifacts(mreg: Any, tmp_path: Path, fmt: str) -> None:
    pytest.importorskip("llama_cpp" if fmt == "gguf" else "onnxruntime")
    pytest.importorskip("torch")
    from support.tiny_models import build_tiny_llama

    src = build_tiny_llama(tmp_path / "llama", seed=5)
    target = "gguf:F16" if fmt == "gguf" else "onnx"
    assert mreg("convert", src, "--to", target, "--to", "hf", "--name", "t").exit_code == 0
    golden = write_golden(tmp_path / f"{fmt}.jsonl", [
        {"id": "p", "prompt": "Hello, my name is", "max_new_tokens": 6},
        {"id": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_new_tokens": 4},
        {"id": "tools", "messages": [{"role": "user", "content": "Weather?"}], "max_new_tokens": 4, "tools": [
            {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]}])
    rec = mreg("check", "t@1", "--golden", golden, "--format", fmt, "--record-baseline", "--json")
    assert rec.exit_code == 0, rec.stderr
    assert rec.json["runtime"] == {"gguf": "llama.cpp", "onnx": "onnxruntime"}[fmt]
    assert all(c["output_tokens"] > 0 for c in rec.json["cases"])
    again = mreg("check", "t@1", "--golden", golden, "--format", fmt, "--json")
    assert again.exit_code == 0 and again.json["baseline_from"] == 1, "greedy runs through the runtime repeat"
    if fmt == "onnx":
        hf = mreg("check", "t@1", "--golden", golden, "--format", "hf", "--json")
        assert [c["output"] for c in hf.json["cases"]] == [c["output"] for c in rec.json["cases"]], \
            "ONNX Runtime generates what transformers generates"


FAKE_CRASHING_LLAMA = '''
"""A llama_cpp that dies by SIGSEGV, as llama.cpp's repacked kernels do on CPUs with AMX."""
import os
import signal

__version__ = "0-crashing"


class _Params:
    pass


class llama_cpp:
    @staticmethod
    def llama_model_default_params():
        return _Params()


def _die():
    os.kill(os.getpid(), signal.SIGSEGV)


class Llama:
    metadata = {}

    def __init__(self, model_path, **kwargs):
        if os.environ.get("CRASH_AT") == "load":
            _die()

    def n_ctx(self):
        return 256

    def token_bos(self):
        return 1

    def token_eos(self):
        return 2

    def detokenize(self, tokens):
        return b""

    def tokenize(self, text, add_bos=True, special=True):
        return [1, 2, 3]

    def reset(self):
        pass

    def create_completion(self, *args, **kwargs):
        _die()

    def close(self):
        pass
'''


@pytest.mark.parametrize("at", ["load", "generate"])
def test_a_runtime_that_segfaults_is_one_error_line_not_mreg_s_death(mreg: Any, tmp_path: Path, store_root: Path,
                                                                      monkeypatch: pytest.MonkeyPatch, at: str) -> None:
    """llama.cpp runs in a child process: its SIGSEGV is exit 12, the signal named, valid --json, no record."""
    pytest.importorskip("llama_cpp")
    from support.tiny_models import build_tiny_llama

    src = build_tiny_llama(tmp_path / "llama", seed=5)
    assert mreg("convert", src, "--to", "gguf:F16", "--name", "t").exit_code == 0
    fake = tmp_path / "fake" / "llama_cpp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_CRASHING_LLAMA)
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))  # the child imports this llama_cpp first
    monkeypatch.setenv("CRASH_AT", at)
    golden = write_golden(tmp_path / "g.jsonl", [{"id": "p", "prompt": "Hello", "max_new_tokens": 4}])
    r = mreg("check", "t@1", "--golden", golden, "--format", "gguf", "--json")
    assert r.exit_code == 12, r.stderr
    error = r.json["error"]
    assert error["type"] == "RuntimeCrashed" and error["exit_code"] == 12
    assert "killed by SIGSEGV" in error["message"] and ("loading" if at == "load" else "generating") in error["message"]
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == [f"error: {error['message']}"]
    assert error["hint"]
    assert not (store_root / "models" / "t" / "checks").exists(), "a crashed run records nothing"
