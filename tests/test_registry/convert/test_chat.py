"""mreg's chat-template renderer against transformers' own, on every real template llama.cpp collects.

The templates are llama.cpp's `models/templates/*.jinja` (from the llama-cpp-python source package,
tests/support/llama_cpp_source.py): one or more per model family, tool-calling ones included. Each is
rendered for several conversations by registry.convert.chat and by a transformers tokenizer's
`apply_chat_template(..., chat_template=TEMPLATE, tokenize=False)`; the texts must be equal, and
where transformers raises, mreg must raise a UsageError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.llama_cpp_source import templates

from registry.convert import chat
from registry.errors import UsageError

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
USER = {"role": "user", "content": "What is the capital of France? Réponds «vite» <b>please</b>."}
# Mistral's templates want 9-character alphanumeric call ids.
CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "call0abc1", "type": "function", "function": {
    "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}
RESULT = {"role": "tool", "tool_call_id": "call0abc1", "name": "get_weather",
          "content": json.dumps({"temperature": 22, "sky": "clear"})}
#: Conversations, each rendered with and without the generation prompt: (messages, tools).
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "user": ([USER], None),
    "system+user": ([SYSTEM, USER], None),
    "multi-turn": ([SYSTEM, USER, {"role": "assistant", "content": "Paris."},
                    {"role": "user", "content": "And of Italy?"}], None),
    "reasoning": ([USER, {"role": "assistant", "content": "Paris.", "reasoning_content": "France's capital."},
                   {"role": "user", "content": "Thanks!"}], None),
    "tools-offered": ([SYSTEM, {"role": "user", "content": "Weather in Paris?"}], TOOLS),
    "tool-call": ([{"role": "user", "content": "Weather in Paris?"}, CALL, RESULT], TOOLS),
    # As OpenAI's API sends it: no content beside the call (transformers drops the None-valued key).
    "tool-call-null-content": ([{"role": "user", "content": "Weather in Paris?"}, {**CALL, "content": None}, RESULT,
                                {"role": "assistant", "content": "22 °C and clear."}], TOOLS),
}

#: Templates transformers itself cannot render for any of these conversations, with the reason
#: (docs/guides/chat-templates.md lists them).
UNRENDERABLE: dict[str, str] = {
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja":
        "iterates `tools` even when none are given (None is not iterable), and reads `tool.description` at the "
        "top level: it wants Cohere's own flat tool format, not the JSON-schema function specs transformers passes",
    "fireworks-ai-llama-3-firefunction-v2.jinja":
        "concatenates a `functions` variable (a JSON string Fireworks' server passes) that transformers never defines",
}


def _template_files() -> list[Path]:
    """The template files, found without extracting (collection must not fail when the source is unavailable)."""
    import os
    import tarfile

    from support.llama_cpp_source import SDIST_ENV

    archive = os.environ.get(SDIST_ENV)
    if not archive or not Path(archive).is_file():
        return []
    with tarfile.open(archive) as tar:
        names = [m.name for m in tar.getmembers() if "/vendor/llama.cpp/models/templates/" in m.name
                 and m.name.endswith(".jinja") and m.isfile()]
    return [Path(n.rsplit("/", 1)[-1]) for n in sorted(names)]


NAMES = [p.name for p in _template_files()] or ["(no llama.cpp source)"]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """A transformers tokenizer with named special tokens (transformers passes them to every template)."""
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", "<pad>", "hello"])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")


def _transformers(tok: Any, template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  generation: bool) -> str | BaseException:
    try:
        text: str = tok.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False,
                                            add_generation_prompt=generation)
    except Exception as e:  # noqa: BLE001 - whatever transformers raises, mreg must raise too
        return e
    return text


def _mreg(tok: Any, template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
          generation: bool) -> str | UsageError:
    try:
        return chat.render(template, messages, tools=tools, add_generation_prompt=generation,
                           special_tokens=tok.special_tokens_map)
    except UsageError as e:
        return e


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_every_real_template_renders_as_transformers_renders_it(name: str, llama_cpp_root: Path,
                                                                tokenizer: Any) -> None:
    template = (templates(llama_cpp_root) / name).read_text(encoding="utf-8")
    rendered = 0
    for label, (messages, tools) in CONVERSATIONS.items():
        for generation in (True, False):
            theirs = _transformers(tokenizer, template, messages, tools, generation)
            mine = _mreg(tokenizer, template, messages, tools, generation)
            where = f"{name}, {label}, add_generation_prompt={generation}"
            if isinstance(theirs, BaseException):
                assert isinstance(mine, UsageError), f"{where}: transformers raised {theirs!r}, mreg rendered"
                assert "\n" not in str(mine) and mine.hint, f"{where}: one line and a next step"
            else:
                assert not isinstance(mine, UsageError), f"{where}: transformers rendered, mreg raised {mine}"
                assert mine == theirs, where
                rendered += 1
    if name in UNRENDERABLE:
        assert rendered == 0, f"{name} renders now: drop it from UNRENDERABLE and docs/guides/chat-templates.md"
    else:
        assert rendered > 0, f"transformers renders no conversation with {name}: list it in UNRENDERABLE"


def test_the_collection_is_all_there(llama_cpp_root: Path) -> None:
    found = sorted(p.name for p in templates(llama_cpp_root).glob("*.jinja"))
    assert found == sorted(NAMES) and len(found) >= 70
    assert set(UNRENDERABLE) <= set(found)


def test_raise_exception_and_syntax_errors_are_one_usage_error_line() -> None:
    refusing = ("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must\nalternate') }}"
                "{% endif %}")
    with pytest.raises(UsageError) as e:
        chat.render(refusing, [{"role": "system", "content": "x"}])
    assert str(e.value) == "the chat template refuses this conversation: Conversation roles must alternate"
    assert e.value.hint and e.value.exit_code == 2
    with pytest.raises(UsageError) as e:
        chat.render("{% for m in messages %}{{ m.content }}", [{"role": "user", "content": "x"}])
    assert str(e.value).startswith("the chat template is not valid Jinja:") and "line 1" in str(e.value)
    with pytest.raises(UsageError, match="at least one message"):
        chat.render("{{ messages }}", [])


def test_the_sandbox_and_transformers_globals() -> None:
    """What transformers' environment has: trimmed blocks, loop controls, generation blocks, tojson, dict, namespace."""
    template = ("{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}\n"
                "{% generation %}{{ m.content | tojson }}{% endgeneration %}|{% endfor %}"
                "{{ dict(a=1) | tojson(indent=1, sort_keys=True) }}{% set ns = namespace(n=0) %}")
    out = chat.render(template, [{"role": "user", "content": "<é>"}, {"role": "skip", "content": "x"}])
    assert out == '"<é>"|{\n "a": 1\n}'
    with pytest.raises(UsageError, match="SecurityError"):
        chat.render("{% set ns = namespace(_x=1) %}", [{"role": "user", "content": "x"}])
    with pytest.raises(UsageError, match="SecurityError"):
        chat.render("{{ messages.append(1) }}", [{"role": "user", "content": "x"}])
    none_dropped = chat.render("{{ 'content' in messages[0] }}", [{"role": "assistant", "content": None}])
    assert none_dropped == "False", "a None-valued key is dropped, as transformers drops it"
    assert chat.render("{{ bos_token is defined }}{{ eos_token }}", [{"role": "user", "content": "x"}],
                       special_tokens={"bos_token": None, "eos_token": "</s>"}) == "False</s>"
