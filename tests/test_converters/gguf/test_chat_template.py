"""Chat templates through GGUF: stored as transformers reads them, rendered as transformers renders them.

A tiny Qwen2 model carries Qwen2.5-7B-Instruct's real template (llama.cpp's copy,
tests/support/llama_cpp_source.py), which starts `{%- if tools %}`: the GGUF file must hold it
byte for byte, `mreg check` must render golden cases with messages and tools through it, and
what llama.cpp is given must be exactly what transformers' apply_chat_template makes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert
from support.llama_cpp_source import QWEN25_TEMPLATE, field, templates
from support.tiny_models import rewrite_config

from converters.gguf.verify import gguf_reader
from manifests import Manifest

pytest.importorskip("gguf")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CASES: list[dict[str, Any]] = [
    {"id": "chat", "messages": [{"role": "system", "content": "You are terse."},
                                {"role": "user", "content": "Capital of France?"}], "max_new_tokens": 4},
    {"id": "default-system", "messages": [{"role": "user", "content": "Hi"}], "max_new_tokens": 4},
    {"id": "tools", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
     "max_new_tokens": 4},
    {"id": "tool-call", "tools": TOOLS, "max_new_tokens": 4, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "22 C, clear"}]},
]


def _qwen(tiny_model: Callable[..., Path], template: str, *, as_file: bool) -> Path:
    """The tiny qwen2 model with `template`: in tokenizer_config.json, or in chat_template.jinja beside a stale one."""
    src = tiny_model("qwen2")
    rewrite_config(src, max_position_embeddings=1024)  # room for the tool specs Qwen's template writes out
    config_path = src / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["model_max_length"] = 1024
    if as_file:
        config["chat_template"] = "{{ 'the stale template a chat_template.jinja replaces' }}"
        (src / "chat_template.jinja").write_text(template, encoding="utf-8")
    else:
        config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2))
    return src


def _gguf_file(store_root: Path, version: int) -> Path:
    art, tree = artifact(store_root, "m", version, "gguf")
    (entry,) = art["files"]
    return tree / entry["path"]


@pytest.mark.parametrize("as_file", [False, True], ids=["tokenizer_config", "chat_template.jinja"])
@pytest.mark.slow
def test_the_file_holds_the_template_transformers_loads(as_file: bool, llama_cpp_root: Path, mreg: Any,
                                                        store_root: Path, tiny_model: Callable[..., Path]) -> None:
    transformers = pytest.importorskip("transformers")
    raw = (templates(llama_cpp_root) / QWEN25_TEMPLATE).read_bytes()
    src = _qwen(tiny_model, raw.decode("utf-8"), as_file=as_file)
    path = _gguf_file(store_root, convert(mreg, src, "gguf:F16")["version"])
    stored = field(gguf_reader(path), "tokenizer.chat_template")
    assert stored.encode("utf-8") == raw, "byte for byte"
    assert transformers.AutoTokenizer.from_pretrained(src).chat_template == stored


@pytest.mark.slow
def test_named_templates_are_kept_and_tools_choose_tool_use(mreg: Any, store_root: Path,
                                                            tiny_model: Callable[..., Path]) -> None:
    """additional_chat_templates/NAME.jinja: stored as tokenizer.chat_template.NAME, as llama.cpp's converter does;
    with tools, `tool_use` renders (transformers' choice)."""
    pytest.importorskip("llama_cpp")
    src = _qwen(tiny_model, "default:{{ messages[0].content }}", as_file=True)
    (src / "additional_chat_templates").mkdir()
    (src / "additional_chat_templates" / "tool_use.jinja").write_text("tools:{{ tools | length }}")
    version = convert(mreg, src, "gguf:F16")["version"]
    reader = gguf_reader(_gguf_file(store_root, version))
    assert field(reader, "tokenizer.chat_template") == "default:{{ messages[0].content }}"
    assert field(reader, "tokenizer.chat_template.tool_use") == "tools:{{ tools | length }}"
    assert field(reader, "tokenizer.chat_templates") == ["tool_use"]
    session = _session(store_root, version)
    try:
        assert session.render_chat([{"role": "user", "content": "hi"}]) == "default:hi"
        assert session.render_chat([{"role": "user", "content": "hi"}], TOOLS) == "tools:1"
    finally:
        session.close()


def _session(store_root: Path, version: int) -> Any:
    from converters.gguf.runtime import GGUFSession

    manifest = Manifest.model_validate_json((store_root / "models/m/versions" / str(version) / "manifest.json")
                                            .read_text())
    return GGUFSession(_gguf_file(store_root, version), manifest)


@pytest.mark.slow
def test_check_renders_messages_and_tools_exactly_as_transformers(llama_cpp_root: Path, mreg: Any, store_root: Path,
                                                                   tmp_path: Path,
                                                                   tiny_model: Callable[..., Path]) -> None:
    """Qwen2.5's real template: `mreg check` passes on GGUF, ONNX and hf, and llama.cpp is given transformers' text."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    transformers = pytest.importorskip("transformers")
    template = (templates(llama_cpp_root) / QWEN25_TEMPLATE).read_text(encoding="utf-8")
    src = _qwen(tiny_model, template, as_file=True)
    converted = mreg("convert", src, "--to", "gguf:F16", "--to", "hf", "--to", "onnx", "--name", "m")
    assert converted.exit_code == 0, converted.stderr
    golden = tmp_path / "chat.jsonl"
    golden.write_text("".join(json.dumps(c) + "\n" for c in CASES))
    counts = {}
    for fmt in ("gguf", "hf", "onnx"):
        r = mreg("check", "m@1", "--golden", golden, "--format", fmt, "--json")
        assert r.exit_code == 0, r.stdout + r.stderr
        assert [c["id"] for c in r.json["cases"]] == [c["id"] for c in CASES]
        assert all(c["passed"] and c["prompt_tokens"] > 0 for c in r.json["cases"])
        counts[fmt] = [c["prompt_tokens"] for c in r.json["cases"]]
    assert counts["gguf"] == counts["hf"] == counts["onnx"], "the same prompts, in the same tokens"
    tokenizer = transformers.AutoTokenizer.from_pretrained(src)
    session = _session(store_root, 1)
    try:
        for case in CASES:
            theirs = tokenizer.apply_chat_template(case["messages"], tools=case.get("tools"), tokenize=False,
                                                   add_generation_prompt=True)
            assert session.render_chat(case["messages"], case.get("tools")) == theirs, case["id"]
    finally:
        session.close()
    assert "<tools>" in theirs and '"name": "get_weather"' in theirs and "<tool_response>" in theirs


REFUSING = ("{%- if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
            "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
def test_a_template_that_refuses_the_case_is_a_usage_error(fmt: str, mreg: Any, store_root: Path, tmp_path: Path,
                                                            tiny_model: Callable[..., Path]) -> None:
    """Gemma-style `raise_exception`: exit 2, one error line naming the case and the template's words, valid --json."""
    pytest.importorskip("llama_cpp" if fmt == "gguf" else "torch")
    src = _qwen(tiny_model, REFUSING, as_file=False)
    assert mreg("convert", src, "--to", "gguf:F16" if fmt == "gguf" else "hf", "--name", "m").exit_code == 0
    golden = tmp_path / "g.jsonl"
    golden.write_text(json.dumps({"id": "sys", "messages": [{"role": "system", "content": "x"},
                                                            {"role": "user", "content": "y"}]}) + "\n")
    r = mreg("check", "m@1", "--golden", golden, "--format", fmt, "--json")
    assert r.exit_code == 2, r.stderr
    error = r.json["error"]
    assert error["type"] == "UsageError" and error["exit_code"] == 2 and error["hint"]
    assert error["message"] == "case 'sys': the chat template refuses this conversation: System role not supported"
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == [f"error: {error['message']}"]
    assert "Traceback" not in r.stderr
    assert not (store_root / "models" / "m" / "checks").exists(), "a refused run records nothing"


def test_a_template_that_writes_bos_gets_one_bos(mreg: Any, store_root: Path, tmp_path: Path,
                                                 tiny_model: Callable[..., Path]) -> None:
    """Llama's template writes `bos_token` itself: the rendered chat is tokenized as transformers'
    apply_chat_template(tokenize=True) does, without adding a second BOS, in every format."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    src = tiny_model("llama")
    assert mreg("convert", src, "--to", "gguf:F16", "--to", "hf", "--name", "m").exit_code == 0
    messages = [{"role": "user", "content": "Capital of France?"}]
    golden = tmp_path / "chat.jsonl"
    golden.write_text(json.dumps({"id": "chat", "messages": messages, "max_new_tokens": 2}) + "\n")
    tokenizer = transformers.AutoTokenizer.from_pretrained(src)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    assert ids.count(tokenizer.bos_token_id) == 1
    for fmt in ("gguf", "hf"):
        r = mreg("check", "m@1", "--golden", golden, "--format", fmt, "--json")
        assert r.exit_code == 0, r.stdout + r.stderr
        assert r.json["cases"][0]["prompt_tokens"] == len(ids), fmt
