"""Chat templates rendered exactly as transformers' `apply_chat_template(..., tokenize=False)` renders them.

A golden case's `messages` must reach every runtime as the same prompt: a GGUF file carries its
model's Jinja template, and llama.cpp is only a fair stand-in for transformers when the text in
front of it is the text transformers would have made. transformers is not needed for GGUF checks,
so this module re-creates what transformers 5 does (`utils/chat_template_utils.py` and
`PreTrainedTokenizerBase.apply_chat_template`) on jinja2 alone:

- the environment: jinja2's `ImmutableSandboxedEnvironment` (a template is code from the hub),
  `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block that
  renders its body (transformers uses it only to mask assistant tokens), a `tojson` filter that
  does not escape HTML and takes json.dumps' arguments, the globals `raise_exception`,
  `strftime_now`, a `dict` without attribute tricks and a `namespace` that refuses underscore names;
- the inputs: each message with its None-valued keys dropped and its reasoning aliased
  (`reasoning_content`, `thinking`, `reasoning`), then `messages`, `tools`, `documents`,
  `add_generation_prompt` and the tokenizer's named special tokens (`bos_token`, `eos_token`, ...).

Whatever a template raises (its own `raise_exception`, an undefined attribute, a sandbox refusal,
a syntax error) comes back as one `UsageError` line with a next step.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.exceptions
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.sandbox
import jinja2.utils

from registry.convert import budget
from registry.errors import UsageError

#: transformers' named special tokens (`SPECIAL_TOKENS_ATTRIBUTES`), the ones it passes to every template.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: Names a message's reasoning comes under; transformers fills the first and `thinking` (gpt-oss reads it).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
#: What a refused render tells the user to do.
_HINT = ("make the case's messages and tools what this model's chat template accepts (roles, order, fields), "
         "or give the case a `prompt` instead of `messages`")


def render(template: str, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
           documents: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True,
           special_tokens: Mapping[str, str | None] | None = None) -> str:
    """The prompt `template` makes of a conversation, as transformers' apply_chat_template makes it.

    `special_tokens` maps names such as `bos_token` to the token's text; None values are left out,
    as transformers leaves out a tokenizer's unset tokens (the template then sees them undefined).
    """
    if not messages:
        raise UsageError("a chat needs at least one message", hint="give the case one or more messages")
    compiled = compile_template(template)
    variables: dict[str, Any] = {k: v for k, v in (special_tokens or {}).items() if v is not None}
    variables.update(messages=[_aliased(_plain(_without_none(m))) for m in messages],
                     tools=None if tools is None else _plain(list(tools)),
                     documents=None if documents is None else _plain(list(documents)),
                     add_generation_prompt=add_generation_prompt)
    pieces: list[str] = []
    try:
        with budget.spending() as spent:
            for piece in compiled.generate(**variables):  # every piece was counted as it was written (budget.Guard)
                spent.tick()
                pieces.append(piece)
    except Exception as e:  # a template is a program from the model's repository: all it raises is its refusal
        # of this input (TemplateError, TypeError, KeyError...), reported as one line, never a traceback.
        raise failure(e) from e
    return "".join(pieces)


def failure(error: BaseException) -> UsageError:
    """One UsageError line for what rendering a chat template raised (here or in transformers)."""
    said = " ".join(str(error).split())
    said = said if len(said) <= 300 else said[:299] + "…"
    if isinstance(error, budget.Exceeded):
        return BudgetExceeded(f"the chat template {said}",
                              hint=f"a chat template may take {budget.TIME_BUDGET:g} s and make {budget.MAX_TEXT} "
                                   "characters: fix the model's chat template, or give the case a `prompt` instead "
                                   "of `messages`")
    if type(error) is jinja2.TemplateError:  # what raise_exception raises, in transformers and here
        return UsageError(f"the chat template refuses this conversation: {said}", hint=_HINT)
    if isinstance(error, jinja2.TemplateSyntaxError):
        return UsageError(f"the chat template is not valid Jinja: {said} (line {error.lineno})",
                          hint="fix chat_template in the model's tokenizer_config.json or chat_template.jinja, "
                               "then convert again; or give the case a `prompt` instead of `messages`")
    return UsageError(f"the chat template fails on this conversation: {type(error).__name__}: {said}", hint=_HINT)


class BudgetExceeded(UsageError):
    """A chat template ran past its time or size budget (`registry.convert.budget`)."""


@functools.lru_cache(maxsize=32)
def compile_template(template: str) -> jinja2.Template:
    """The template compiled in transformers' environment (once per text); a syntax error is a UsageError."""
    try:
        return _environment().from_string(template)
    except jinja2.TemplateError as e:
        raise failure(e) from e


@functools.cache
def _environment() -> jinja2.Environment:
    """transformers' sandboxed chat-template environment, with its filter and globals."""
    env = _BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols, budget.Guard])
    env.filters["tojson"] = _tojson
    env.filters.update({name: budget.guard_filter(name, f) for name, f in env.filters.items()})
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                       namespace=_TemplateNamespace)
    return env


class _BoundedEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """transformers' sandbox, with every loop, call, lookup and growing operator under the render's budget."""

    intercepted_binops = budget.INTERCEPTED

    def _parse(self, source: str, name: str | None, filename: str | None) -> jinja2.nodes.Template:
        tree = super()._parse(source, name, filename)
        rewritten: jinja2.nodes.Template = budget.Rewrite(budget.Guard.identifier).visit(tree)
        return rewritten

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        """`*`, `+`, `**` and `%`, their results' sizes known before they are made."""
        return budget.binop(operator, left, right)

    def call(self, context: jinja2.runtime.Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        """A call from the template (positional-only: a template may pass `obj` or `context` as keywords): the clock
        looked at, a sizing argument bounded."""
        budget.before_call(obj, args, kwargs)
        return super().call(context, obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        """`a.b`, the clock looked at."""
        budget.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        """`a[b]`, the clock looked at."""
        budget.tick()
        return super().getitem(obj, argument)


def _raise_exception(message: str) -> None:
    """The template's own refusal; `failure` tells it apart from other errors by its exact type."""
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """json.dumps with transformers' defaults: no HTML escaping (jinja's own filter escapes `<`), no ASCII-only."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    """Today's date or time in a template's format (Llama 3.1 writes the date into its system prompt)."""
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without the type object's attributes to climb."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _check_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
            "Please rename the attribute.")


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja's `namespace`, refusing underscore-prefixed names (a way into CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # no named self, as jinja's: `namespace(self=1)` works
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant text with it; rendering keeps the body."""

    tags = {"generation"}  # noqa: RUF012 - jinja's Extension declares it so

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        """The block's body, rendered through `_body`."""
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        block = jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body)
        block.set_lineno(lineno)
        return block

    def _body(self, caller: jinja2.runtime.Macro) -> str:
        return str(caller())


def _without_none(message: Mapping[str, Any]) -> dict[str, Any]:
    """transformers drops None-valued keys: many templates render a literal "None" for `content: null`."""
    return {k: v for k, v in message.items() if v is not None}


def _aliased(message: Any) -> Any:
    """A message's reasoning under every name templates read it by, as transformers fills them."""
    if isinstance(message, dict):
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            return {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def _plain(value: Any) -> Any:
    """A fresh copy in plain JSON types (templates may not reach methods of richer objects; edits stay local)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"
