"""What rendering one chat template may spend: a time budget and a size budget, enforced inside jinja's sandbox.

A template is a program from the model's repository. Rendering one runs in this process (a
subprocess per render would cost more than the render, and could not run where a runtime has
already started threads), so the work is bounded where the sandbox hands mreg control:

- time: every loop's iterable is wrapped (the template's syntax tree is rewritten before it is
  compiled), and every call, attribute lookup, filter and output piece looks at the clock: two
  nested `range(99999)` loops stop at the deadline instead of running for hours;
- size: a value may not grow past `MAX_TEXT` (string and list repetition, `+`, `~`, `join`,
  `replace`, `%` and `format` checked before they allocate, every filter's result after), numbers that
  size an allocation (`'x'.ljust(n)`, `center`, `indent`, `tojson(indent=…)`, a format width) may
  not pass `MAX_WIDTH`, and the text a render writes, emitted or captured in a `{% set %}` block or a
  macro, may not pass `MAX_TEXT` in all.

`Exceeded` says which budget ran out; the renderer turns it into one line.
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
import re
import string
import time
from collections.abc import Callable, Iterator
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.runtime
import jinja2.visitor

#: Seconds one render may take (real templates take milliseconds; a slow CI machine is far inside this).
TIME_BUDGET = 10.0
#: Characters a rendered prompt, or any value a template makes, may hold (16 Mi: some 4 M tokens, thirty times the
#: longest context served today).
MAX_TEXT = 16 << 20
#: Largest width a template may ask a string to be padded, indented or wrapped to (no real one asks for more than
#: a few dozen); it also bounds numbers inside format strings.
MAX_WIDTH = 1 << 16
#: Filters whose numeric arguments size their result.
_SIZING_FILTERS = frozenset({"center", "indent", "tojson", "wordwrap", "batch", "slice"})
#: str methods whose numeric arguments size their result.
_SIZING_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})
_DIGITS = re.compile(r"\d+")
#: A printf-style conversion's width and precision (`%-10.3f`, `%*s`, `%(name)5d`); `%%` has neither.
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\*|\d*)(?:\.(\*|\d*))?[a-zA-Z%]")


class Exceeded(Exception):
    """A render ran past one of its budgets."""


class Budget:
    """One render's deadline and size limit."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.written = 0

    def tick(self) -> None:
        """Stop a render past its deadline."""
        if time.monotonic() > self.deadline:
            raise Exceeded(f"ran past its time budget of {self.seconds:g} s")

    def wrote(self, piece: str) -> None:
        """Count a piece of output against the size budget."""
        self.written += len(piece)
        if self.written > MAX_TEXT:
            raise Exceeded(f"wrote more than {MAX_TEXT} characters")


_CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("mreg_chat_budget", default=None)


@contextlib.contextmanager
def spending(seconds: float | None = None) -> Iterator[Budget]:
    """Run a render under a fresh budget (TIME_BUDGET seconds unless told)."""
    budget = Budget(TIME_BUDGET if seconds is None else seconds)
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


def tick() -> None:
    """Look at the clock of the render in progress, if any."""
    budget = _CURRENT.get()
    if budget is not None:
        budget.tick()


def weight(value: Any, limit: int = MAX_TEXT) -> int:
    """Characters (and one per element) a value holds, counted through nesting, shared parts as often as they
    appear (a serializer writes them that often); stops counting once past `limit`."""
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            total += len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            total += len(v)
            stack.extend(v)
        else:
            total += 1
    return total


def check_size(value: Any, what: str) -> Any:
    """`value`, or Exceeded when it holds more than MAX_TEXT."""
    if weight(value) > MAX_TEXT:
        raise Exceeded(f"made a value of more than {MAX_TEXT} characters ({what})")
    return value


def check_width(number: Any, what: str) -> None:
    """Exceeded for a number that would size an allocation past MAX_WIDTH."""
    if isinstance(number, int | float) and not isinstance(number, bool) and abs(number) > MAX_WIDTH:
        raise Exceeded(f"asked for a width of {number:g} in {what}, past {MAX_WIDTH}")


def check_format(text: Any, args: Any, what: str) -> None:
    """Exceeded for a format string whose width or precision passes MAX_WIDTH (`'{:>99999999}'`, `'%99999999s'`),
    or takes one from its arguments (`'%*s'`, `'{:{}}'`) that does; plain numbers formatted are no widths."""
    if not isinstance(text, str):
        return
    widths: list[str] = []
    from_args = False
    if "{" in text:
        try:
            for _literal, _field, spec, _conversion in string.Formatter().parse(text):
                widths += _DIGITS.findall(spec or "")
                from_args = from_args or "{" in (spec or "")
        except ValueError:  # not a format string: str.format raises that itself
            pass
    if "%" in text:
        for width, precision in _PERCENT.findall(text):
            widths += [w for w in (width, precision) if w != "*"]
            from_args = from_args or "*" in (width, precision)
    for digits in widths:
        if digits and len(digits) > 5 and int(digits) > MAX_WIDTH:
            raise Exceeded(f"asked for a width of {digits} in {what}, past {MAX_WIDTH}")
    if from_args:
        values = args.values() if isinstance(args, dict) else args if isinstance(args, tuple | list) else (args,)
        for value in values:
            check_width(value, what)


def binop(op: str, left: Any, right: Any) -> Any:
    """An intercepted operator, its result's size known before it is made."""
    tick()
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(n, int) and not isinstance(n, bool) \
                    and weight(seq) * max(n, 0) > MAX_TEXT:
                raise Exceeded(f"repeated a value past {MAX_TEXT} characters")
    elif op == "+" and isinstance(left, str | list | tuple):
        if weight(left) + weight(right) > MAX_TEXT:
            raise Exceeded(f"joined values past {MAX_TEXT} characters")
    elif op == "**" and isinstance(left, int | float) and isinstance(right, int | float):
        if abs(right) > 1024 and abs(left) > 1:  # an exponent that size only makes a number of thousands of digits
            raise Exceeded(f"raised a number to the power {right:g}")
    elif op == "%" and isinstance(left, str):
        check_format(left, right, "a % format")
    return _BINOPS[op](left, right)


_BINOPS: dict[str, Callable[[Any, Any], Any]] = {"*": operator.mul, "+": operator.add, "**": operator.pow,
                                                  "%": operator.mod}
INTERCEPTED = frozenset(_BINOPS)


def before_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """What a call may not ask for: a str method padding or formatting past MAX_WIDTH, a join or replace whose
    result would pass MAX_TEXT."""
    tick()
    name = getattr(obj, "__name__", "")
    owner = getattr(obj, "__self__", None)
    if isinstance(owner, str) or name in ("format", "format_map"):
        if name in ("format", "format_map"):
            # the sandbox hands out str.format as a wrapper of the bound method: the string is its __self__
            text = owner if isinstance(owner, str) else getattr(getattr(obj, "__wrapped__", None), "__self__", None)
            check_format(text, (*args, *kwargs.values(), *(args[0].values() if name == "format_map" and args
                                                           and isinstance(args[0], dict) else ())), "str.format")
        elif name in _SIZING_METHODS:
            for a in (*args, *kwargs.values()):
                check_width(a, f"str.{name}")
        elif name == "join" and args and isinstance(owner, str):
            _check_join(owner, args[0])
        elif name == "replace" and len(args) >= 2 and isinstance(owner, str):
            _check_replace(owner, args[0], args[1])


def _check_join(sep: Any, items: Any) -> None:
    if isinstance(items, list | tuple) and isinstance(sep, str) \
            and weight(items) + len(sep) * len(items) > MAX_TEXT:
        raise Exceeded(f"joined values past {MAX_TEXT} characters")


def _check_replace(text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str) and \
            len(text) + (text.count(old) if old else len(text) + 1) * len(new) > MAX_TEXT:
        raise Exceeded(f"replaced text past {MAX_TEXT} characters")


def guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that looks at the clock, refuses a sizing argument past MAX_WIDTH, and whose result is bounded."""
    def guarded(*args: Any, **kwargs: Any) -> Any:
        tick()
        values = [a for a in args if not isinstance(a, jinja2.runtime.Context | jinja2.Environment
                                                     | jinja2.nodes.EvalContext)]
        if name in _SIZING_FILTERS:
            for a in (*values[1:], *kwargs.values()):
                check_width(a, f"the {name} filter")
        if name == "format" and values:
            check_format(values[0], (*values[1:], *kwargs.values()), "the format filter")
        if name == "join" and values:
            _check_join(kwargs.get("d", values[1] if len(values) > 1 else ""), values[0])
        if name == "replace" and len(values) >= 3:
            _check_replace(values[0], values[1], values[2])
        return check_size(func(*args, **kwargs), f"the {name} filter")

    for attr in ("jinja_pass_arg",):  # how jinja knows to pass the environment or context first
        if hasattr(func, attr):
            setattr(guarded, attr, getattr(func, attr))
    return guarded


class _Loop:
    """A loop's iterable that looks at the clock every few items; its length is the iterable's own."""

    def __init__(self, iterable: Any) -> None:
        self.iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        budget = _CURRENT.get()
        for i, item in enumerate(self.iterable):
            if budget is not None and not i & 63:
                budget.tick()
            yield item

    def __len__(self) -> int:
        return len(self.iterable)


def _concat(*items: Any) -> str:
    """`a ~ b ~ c`, its size known before it is made."""
    tick()
    texts = [str(i) for i in items]
    if sum(len(t) for t in texts) > MAX_TEXT:
        raise Exceeded(f"joined values past {MAX_TEXT} characters")
    return "".join(texts)


class Guard(jinja2.ext.Extension):
    """Holds the loop and concatenation guards that `Rewrite` calls into compiled templates."""

    def loop(self, iterable: Any) -> Any:
        """A loop's iterable, guarded (undefined and other non-iterables pass as they are, for jinja to judge)."""
        return _Loop(iterable) if hasattr(iterable, "__iter__") else iterable

    def concat(self, *items: Any) -> str:
        """`~`, bounded."""
        return _concat(*items)

    def out(self, value: Any) -> str:
        """A piece of output, counted against the size budget whether it is emitted or captured (`{% set %}` blocks,
        macros and `caller()` build their text in memory before anything is emitted)."""
        text = str(value)
        budget = _CURRENT.get()
        if budget is not None:
            budget.wrote(text)
        return text


class Rewrite(jinja2.visitor.NodeTransformer):
    """A template's syntax tree with every loop's iterable, every `~` and every piece of output passed through
    `Guard`."""

    def __init__(self, identifier: str) -> None:
        self.identifier = identifier

    def _call(self, method: str, args: list[Any], lineno: int) -> jinja2.nodes.Call:
        call = jinja2.nodes.Call(jinja2.nodes.ExtensionAttribute(self.identifier, method), args, [], None, None)
        call.set_lineno(lineno)
        return call

    def visit_For(self, node: jinja2.nodes.For) -> jinja2.nodes.Node:
        """The loop's iterable through `Guard.loop`."""
        self.generic_visit(node)
        node.iter = self._call("loop", [node.iter], node.lineno)
        return node

    def visit_Output(self, node: jinja2.nodes.Output) -> jinja2.nodes.Node:
        """Every piece of output through `Guard.out`."""
        self.generic_visit(node)
        node.nodes = [self._call("out", [n], n.lineno or node.lineno) for n in node.nodes]
        return node

    def visit_Concat(self, node: jinja2.nodes.Concat) -> jinja2.nodes.Node:
        """`a ~ b` as `Guard.concat(a, b)`."""
        self.generic_visit(node)
        return self._call("concat", list(node.nodes), node.lineno)
