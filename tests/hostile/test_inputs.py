"""Hostile inputs, third pass (issue 34): shard indexes, safetensors headers the loaders refuse, sizes from a config
or tokenizer, and chat templates that would run or grow without end. Each is refused before anything is allocated.

Table cases are held to the corpus's promise (support.corpus); the rest are plain tests: the header verdicts
compared with the safetensors library's own, and chat templates rendered under their budget.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.cli import run
from support.corpus import Case, Setup, check_case
from support.world import World

from registry.convert import budget, chat
from registry.convert.configs import check_indexes
from registry.convert.kvcache import kv_cache_of
from registry.convert.safetensors import InvalidSafetensors, read_header

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def _convert(target: str) -> list[str | Path]:
    return ["convert", "SRC", "--to", target, "--name", "m"]


# -- shard indexes (severe 7) -----------------------------------------------------------------------------------


def _index(change: Callable[[World, dict[str, str]], dict[str, str]], target: str) -> Setup:
    """The tiny llama with a shard index naming its one file, then changed by `change`."""
    def setup(w: World) -> Sequence[str | Path]:
        weight_map = dict.fromkeys(sorted(read_header(w.src / WEIGHTS)), WEIGHTS)
        (w.src / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": change(w, weight_map)}))
        return _convert(target)
    return setup


def _first_to(shard: str) -> Callable[[World, dict[str, str]], dict[str, str]]:
    return lambda w, m: {**m, next(iter(m)): shard}


def _two_shards(w: World, m: dict[str, str]) -> dict[str, str]:
    shutil.copy(w.src / WEIGHTS, w.src / "model-copy.safetensors")  # every tensor of it in two shards
    return {**m, next(iter(m)): "model-copy.safetensors"}


INDEX_DAMAGE: list[tuple[str, Callable[[World, dict[str, str]], dict[str, str]], int, str, str]] = [
    ("a missing shard", _first_to("model-00002-of-00002.safetensors"), 4, "ShardIndexMismatch",
     "is not in the snapshot"),
    ("a shard that climbs out", _first_to("../../outside/x.safetensors"), 8, "UnsafeInput", "outside the snapshot"),
    ("an absolute shard path", lambda w, m: {**m, next(iter(m)): str(w.outside / "model" / "weights.bin")}, 8,
     "UnsafeInput", "outside the snapshot"),
    ("a tensor no shard holds", lambda w, m: {**m, "model.ghost.weight": WEIGHTS}, 4, "ShardIndexMismatch",
     "does not hold it"),
    ("a tensor left out", lambda w, m: dict(list(m.items())[1:]), 4, "ShardIndexMismatch", "is not in the index"),
    ("a tensor in two shards", _two_shards, 4, "ShardIndexMismatch", "is in both"),
]

# -- safetensors headers the loaders refuse (severe 6) ---------------------------------------------------------


def _header(change: Callable[[dict[str, Any], int], dict[str, Any]], target: str) -> Setup:
    """model.safetensors with its header rewritten by `change(header, body length)`, the body kept."""
    def setup(w: World) -> Sequence[str | Path]:
        path = w.src / WEIGHTS
        data = path.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        body = data[8 + n:]
        raw = json.dumps(change(json.loads(data[8:8 + n]), len(body))).encode()
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)
        return _convert(target)
    return setup


def _empty_tensor(shape: list[int]) -> Callable[[dict[str, Any], int], dict[str, Any]]:
    """An extra tensor of no bytes at the body's end, whose shape the loaders cannot size."""
    return lambda h, end: {**h, "extra": {"dtype": "F32", "shape": shape, "data_offsets": [end, end]}}


HEADER_DAMAGE: list[tuple[str, Callable[[dict[str, Any], int], dict[str, Any]]]] = [
    ("a shape whose product overflows", _empty_tensor([2**62, 2**62, 0, 4])),
    ("a 2**70 dimension", _empty_tensor([2**70, 0])),
    ("__metadata__ not string to string", lambda h, end: {**h, "__metadata__": {"format": 1}}),
]

# -- sizes from a config or tokenizer (severe 3) ---------------------------------------------------------------


def _tokenizer(change: Callable[[dict[str, Any]], None]) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        doc = json.loads((w.src / "tokenizer.json").read_text())
        change(doc)
        (w.src / "tokenizer.json").write_text(json.dumps(doc))
        return _convert("gguf:F16")
    return setup


def _vocab_id(value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        vocab = doc["model"]["vocab"]
        vocab[next(iter(vocab))] = value
    return change


def _added_id(value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["added_tokens"][0]["id"] = value
    return change


def _config(target: str, **changes: Any) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        config = json.loads((w.src / "config.json").read_text())
        (w.src / "config.json").write_text(json.dumps({**config, **changes}))
        return _convert(target)
    return setup


# -- chat templates (severe 8), through `mreg check` ------------------------------------------------------------


def _check_with_template(template: str) -> Setup:
    """Version 1 published --to hf with `template` as its chat template, and a golden set with one chat case."""
    def setup(w: World) -> Sequence[str | Path]:
        path = w.src / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": template}))
        w.publish()
        golden = w.root / "golden.jsonl"
        golden.write_text(json.dumps({"id": "greeting", "messages": [{"role": "user", "content": "hi"}],
                                      "max_new_tokens": 2}) + "\n")
        return ["check", "m@1", "--golden", golden]
    return setup


def _renamed_layer(number: str) -> Callable[[dict[str, Any], int], dict[str, Any]]:
    """Layer 1's tensors renamed to layer `number` (a digit str.isdigit takes and int() refuses or misreads)."""
    def change(h: dict[str, Any], _body: int) -> dict[str, Any]:
        return {k.replace(".layers.1.", f".layers.{number}."): v for k, v in h.items()}
    return change


CASES: list[Case] = [
    *(Case(f"tensors of layer {what} --to gguf:F16", _header(_renamed_layer(n), "gguf:F16"), 4, None)
      for what, n in (("²", "²"), ("١", "١"), ("of 5,000 digits", "1" * 5000))),
    *(Case(f"shard index: {what} --to {t}", _index(change, t), code, error, (says,))
      for what, change, code, error, says in INDEX_DAMAGE for t in ("hf", "gguf:F16")),
    *(Case(f"safetensors {what} --to {t}", _header(change, t), 4, "InvalidSafetensors",
           ("model.safetensors is not a valid safetensors file",))
      for what, change in HEADER_DAMAGE for t in ("hf", "gguf:F16")),
    Case("tokenizer.json vocab id 10**12 --to gguf", _tokenizer(_vocab_id(10**12)), 4, "InvalidConfig",
         ("tokenizer.json", "the id 1000000000000")),
    Case("tokenizer.json added token id 10**12 --to gguf", _tokenizer(_added_id(10**12)), 4, "InvalidConfig",
         ("tokenizer.json", "the id 1000000000000")),
    Case("tokenizer.json vocab id a string --to gguf", _tokenizer(_vocab_id("7")), 4, "InvalidConfig",
         ("tokenizer.json",)),
    Case("tokenizer.json vocab id negative --to gguf", _tokenizer(_vocab_id(-1)), 4, "InvalidConfig",
         ("tokenizer.json",)),
    *(Case(f"config.json {key}={value} --to {t}", _config(t, **{key: value}), 4, "InvalidConfig",
           ("config.json", f"{key} = {value}"))
      for key, value in (("num_hidden_layers", 10**9), ("hidden_size", 10**9), ("vocab_size", 10**12))
      for t in ("hf", "onnx")),
    Case("chat template 'x'*10**10: check", _check_with_template("{{ 'x'*10**10 }}"), 2, "UsageError",
         ("case 'greeting'", "the chat template repeated a value")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_gets_one_line_and_changes_nothing(case: Case, request: pytest.FixtureRequest) -> None:
    check_case(case, request)


# -- shard indexes that agree -----------------------------------------------------------------------------------


def test_an_index_that_agrees_with_its_shards_publishes(world: World) -> None:
    """The same index, unchanged, is no refusal: --to hf publishes it with the weights."""
    _index(lambda w, m: m, "hf")(world)
    r = run("convert", world.src, "--to", "hf", "--name", "m", "--json")
    assert r.exit_code == 0, r.stderr


def test_a_sharded_checkpoint_and_a_component_folder_pass(tmp_path: Path) -> None:
    """Shards named relative to their index's folder, as transformers and diffusers join them."""
    from support.tiny_models import build_tiny_llama

    src = build_tiny_llama(tmp_path / "tiny", shards=3)
    files = {p.relative_to(src).as_posix(): p for p in src.rglob("*") if p.is_file()}
    assert sum(label.endswith(".safetensors") for label in files) == 3
    check_indexes(files)
    check_indexes({f"text_encoder/{label}": p for label, p in files.items()})


# -- safetensors headers: mreg's verdict is the library's -------------------------------------------------------


def _file(header: dict[str, Any] | bytes, body: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


_A = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
_B8 = b"\0" * 8
_A_JSON = b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'


def _with(**extra: Any) -> dict[str, Any]:
    return {"a": _A, **extra}


def _empty(shape: list[int], dtype: str = "F32") -> dict[str, Any]:
    return _with(e={"dtype": dtype, "shape": shape, "data_offsets": [8, 8]})


HEADERS: dict[str, tuple[dict[str, Any] | bytes, bytes]] = {
    "valid": (_with(), _B8),
    "no tensors": ({}, b""),
    "a scalar": ({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}, b"\0" * 4),
    "product overflows before a 0": (_empty([2**62, 2**62, 0, 4]), _B8),
    "product of exactly 2**64": (_empty([2**32, 2**32, 0], "U8"), _B8),
    "a 2**70 dimension": (_empty([2**70, 0]), _B8),
    "a 2**64-1 dimension after a 0": (_empty([0, 2**64 - 1]), _B8),
    "a 2**64-1 dimension before a 0": (_empty([2**64 - 1, 0]), _B8),
    "2**62 F32 elements times 0": (_empty([2**62, 0]), _B8),
    "negative dimension": (_empty([-1]), _B8),
    "float dimension": ({"a": {**_A, "shape": [2.0]}}, _B8),
    "boolean dimension": ({"a": {**_A, "shape": [True, 2]}}, _B8),
    "float offset": ({"a": {**_A, "data_offsets": [0, 8.0]}}, _B8),
    "three offsets": ({"a": {**_A, "data_offsets": [0, 8, 8]}}, _B8),
    "metadata of strings": (_with(__metadata__={"format": "pt"}), _B8),
    "metadata null": (_with(__metadata__=None), _B8),
    "metadata with a number": (_with(__metadata__={"format": 1}), _B8),
    "metadata with an object": (_with(__metadata__={"a": {"b": "c"}}), _B8),
    "metadata a list": (_with(__metadata__=[]), _B8),
    "metadata a string": (_with(__metadata__="pt"), _B8),
    "an empty tensor inside another": (_with(z={"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}), _B8),
    "an empty tensor at the end": (_with(z={"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}), _B8),
    "an empty tensor at the start": (_with(z={"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}), _B8),
    "a gap before a tensor": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, _B8),
    "an unknown field": ({"a": {**_A, "x": 1}}, _B8),
    "a lower-case dtype": ({"a": {**_A, "dtype": "f32"}}, _B8),
    "F8_E8M0": ({"a": {"dtype": "F8_E8M0", "shape": [8], "data_offsets": [0, 8]}}, _B8),
    "C64": ({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, _B8),
    "F4 in whole bytes": ({"a": {"dtype": "F4", "shape": [16], "data_offsets": [0, 8]}}, _B8),
    "F4 in half a byte": ({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"\0\0"),
    "F6_E2M3": ({"a": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}, b"\0" * 3),
    "an entry not an object": ({"a": [1]}, b""),
    "a missing shape": ({"a": {"dtype": "F32", "data_offsets": [0, 8]}}, _B8),
    "a tensor given twice": (b"{" + _A_JSON + b"," + _A_JSON + b"}", _B8),
    "a shape given twice": (b'{"a":{"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]}}', _B8),
    "__metadata__ given twice": (b'{"__metadata__":{},"__metadata__":{},' + _A_JSON + b"}", _B8),
    "a metadata key given twice": (b'{"__metadata__":{"k":"a","k":"b"},' + _A_JSON + b"}", _B8),
    "NaN in an unknown field": (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":NaN}}', _B8),
    "leading spaces": (b"  {" + _A_JSON + b"}", _B8),
    "trailing spaces": (b"{" + _A_JSON + b"}    ", _B8),
    "trailing NULs": (b"{" + _A_JSON + b"}\0\0", _B8),
    "UTF-16": (("{" + _A_JSON.decode() + "}").encode("utf-16"), _B8),
    "a byte-order mark": (b"\xef\xbb\xbf{" + _A_JSON + b"}", _B8),
    "a lone surrogate name": (b'{"\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', _B8),
    "127 levels deep": (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":' + b"[" * 125 + b"]" * 125
                        + b"}}", _B8),
    "128 levels deep": (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":' + b"[" * 126 + b"]" * 126
                        + b"}}", _B8),
    "a 2**64 offset": ({"a": {**_A, "data_offsets": [2**64, 2**64]}}, b""),
    "an exponent dimension": (b'{"a":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}', _B8),
    "a JSON array": (b"[]", b""),
}


@pytest.mark.parametrize("name", list(HEADERS))
def test_header_verdict_is_the_safetensors_librarys(name: str, tmp_path: Path) -> None:
    """mreg's reader accepts a header exactly when safetensors.safe_open does (what the loaders accept)."""
    safetensors = pytest.importorskip("safetensors")
    header, body = HEADERS[name]
    path = tmp_path / "x.safetensors"
    path.write_bytes(_file(header, body))
    try:
        with safetensors.safe_open(str(path), "numpy") as f:
            list(f.keys())
        library = True
    except safetensors.SafetensorError:
        library = False
    try:
        read_header(path)
        mreg = True
    except InvalidSafetensors:
        mreg = False
    verdict = {True: "accepts", False: "refuses"}
    assert mreg == library, f"mreg {verdict[mreg]}, safetensors {verdict[library]}"


# -- sizes from a config --------------------------------------------------------------------------------------------


def test_a_billion_layers_cost_no_memory() -> None:
    """num_hidden_layers = 10**9 in a decoder's config: the KV-cache figures are arithmetic, no list per layer."""
    config = {"architectures": ["MistralForCausalLM"], "num_hidden_layers": 10**9, "num_attention_heads": 8,
              "hidden_size": 64, "sliding_window": 4096, "max_window_layers": 10**8}
    tracemalloc.start()
    try:
        for model_type in ("llama", "gemma2", "gemma3", "qwen3_next"):
            extra = {"full_attention_interval": 4} if model_type == "qwen3_next" else {}
            kv = kv_cache_of({**config, **extra, "model_type": model_type})
            assert kv is not None and kv.layers == 10**9
            assert kv.full_layers + kv.window_layers + kv.uncached_layers == 10**9
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


# -- chat templates (severe 8) ---------------------------------------------------------------------------------------


MESSAGES = [{"role": "user", "content": "hi"}]

TEMPLATES: list[tuple[str, str, str]] = [
    ("two nested range(99999) loops", "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}"
                                       "{% endfor %}", "time budget"),
    ("'x'*10**10", "{{ 'x'*10**10 }}", "repeated a value"),
    ("tojson(indent=1e8)", "{{ messages|tojson(indent=1e8) }}", "width of 1e+08 in the tojson filter"),
    ("a string doubled with ~", "{% set ns = namespace(s='x'*1000000) %}{% for i in range(40) %}"
                                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "joined values"),
    ("a string doubled with +", "{% set ns = namespace(s='x'*1000000) %}{% for i in range(40) %}"
                                "{% set ns.s = ns.s + ns.s %}{% endfor %}", "joined values"),
    ("str.ljust(10**10)", "{{ 'x'.ljust(10**10) }}", "width"),
    ("center(10**10)", "{{ 'x'|center(10**10) }}", "width"),
    ("a format width", "{{ '{:>9999999999}'.format(1) }}", "width"),
    ("a % width", "{{ '%9999999999s' % 1 }}", "width"),
    ("a nested list serialized", "{{ ([['x'*1000]*1000]*1000)|tojson }}", "repeated a value"),
    ("a join past the budget", "{{ (['x'*1000000]*20)|join }}", "repeated a value"),
    ("a replace past the budget", "{{ ('a'*1000000)|replace('a', 'b'*100) }}", "replaced text"),
    ("a huge power", "{{ 2**(10**9) }}", "power"),
    ("output past the budget", "{% for i in range(99999) %}{{ 'x'*1000 }}{% endfor %}", "wrote more than"),
    ("output captured past the budget", "{% set big %}{% for i in range(99999) %}{% for j in range(99999) %}"
                                        + "y" * 1000 + "{% endfor %}{% endfor %}{% endset %}", "wrote more than"),
    ("a macro's output past the budget", "{% macro m() %}{% for i in range(99999) %}" + "z" * 1000
                                         + "{% endfor %}{% endmacro %}{% set s = m() %}", "wrote more than"),
]


@pytest.mark.parametrize(("template", "says"), [(t, s) for _, t, s in TEMPLATES], ids=[n for n, _, _ in TEMPLATES])
def test_chat_template_runs_out_of_budget(template: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused with one line naming the budget, within a second of the deadline, before anything large is made."""
    monkeypatch.setattr(budget, "TIME_BUDGET", 1.0)
    t0 = time.monotonic()
    with pytest.raises(chat.BudgetExceeded) as e:
        chat.render(template, MESSAGES)
    assert time.monotonic() - t0 < 5
    assert says in str(e.value) and str(e.value).startswith("the chat template ")
    assert e.value.exit_code == 2 and e.value.hint


def test_chat_templates_within_budget_render_as_before() -> None:
    """Loops keep their length and last-item flags, `~` and filters their results."""
    template = ("{% for m in messages %}{{ loop.index }}/{{ loop.length }}{% if loop.last %}!{% endif %}"
                "{{ m.role ~ ':' ~ m.content }}{% endfor %}{{ [1, 2]|join(',') }}{{ 'ab'|center(6) }}"
                "{{ '%5s' % 'x' }}{{ messages|tojson(indent=2)|length > 0 }}")
    assert chat.render(template, MESSAGES * 2) == "1/2user:hi2/2!user:hi1,2  ab      xTrue"


@pytest.mark.slow
def test_hf_runtime_refuses_a_runaway_template_before_transformers(world: World,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The transformers-rendered runtime (`mreg check --format hf`) is under the same budget."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from converters.hf.tokenizer import HFTokenizerSession

    monkeypatch.setattr(budget, "TIME_BUDGET", 1.0)
    session = HFTokenizerSession()
    session.tokenizer = AutoTokenizer.from_pretrained(world.src)
    session.tokenizer.chat_template = TEMPLATES[0][1]
    with pytest.raises(chat.BudgetExceeded, match="time budget"):
        session.render_chat(MESSAGES)


def test_numbers_formatted_are_no_widths() -> None:
    """A large number printed through a format, `%` or a filter is output, not a width: it renders."""
    template = ("{{ '{} tokens, {:>5}'.format(1700000000, 'x') }} {{ '%d/%s' % (1700000000, 'y') }} "
                "{{ '%s'|format(1700000000) }} {{ 'limit 1000000 {}'.format(2) }} {{ '%%d %d' % 3 }}")
    assert chat.render(template, MESSAGES) == "1700000000 tokens,     x 1700000000/y 1700000000 limit 1000000 2 %d 3"


@pytest.mark.parametrize("template", ["{{ '{:{}}'.format('x', 10**10) }}", "{{ '%*s' % (10**10, 'x') }}",
                                      "{{ '%*s'|format(10**10, 'x') }}", "{{ '%(a)99999999s' % {'a': 1} }}"])
def test_widths_taken_from_arguments_are_bounded(template: str) -> None:
    """A width a format takes from its arguments is one."""
    with pytest.raises(chat.BudgetExceeded, match="width"):
        chat.render(template, MESSAGES)
