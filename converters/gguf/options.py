"""`--to gguf:…` typed: the file type (or `auto` and its budget), the evaluation text and the importance matrix.

The string form `gguf:Q4_K_M,calibration=FILE,…` is read here (`parse`) and nowhere else; the CLI's flags set
the same fields directly, so that a path holding a comma can be given. `prepare` checks them and reads the
files they name once: the options it records hold the files' digests, and the files travel beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from converters.gguf import auto, imatrix, quality
from converters.gguf import evaluation as texts
from converters.gguf.file import direct_io_setting
from converters.gguf.mix import FILE_TYPES
from converters.gguf.plan import DEFAULT_TYPE
from converters.gguf.quants import check_settings as check_quantizer
from registry.convert.protocol import Options, Prepared, RawOptions, TargetOptions, spec_of
from registry.errors import UsageError

_GRAMMAR = ("options are evaluation=default|FILE, tokens=N, calibration=FILE|default, calibration-ctx=N, "
            "imatrix=FILE and, with auto, a budget (kl=0.02, kl99=0.2, top1=0.9, ppl=1.02)")


@dataclass(frozen=True)
class GGUFOptions:
    """One GGUF target, as given: nothing here is checked or read until it is prepared."""

    format: ClassVar[str] = "gguf"
    #: A file type (any case: `Q4_K_M`, `q8_0`) or `auto`.
    type: str = DEFAULT_TYPE
    #: gguf:auto's budget, as `key=value` (`kl=0.02`, the keys of `--require gguf:…`).
    budget: tuple[str, ...] = ()
    #: `default` or a text file to measure quality on.
    evaluation: str | None = None
    #: The evaluation text's first N tokens.
    tokens: str | None = None
    #: `default` or a text file to compute an importance matrix on.
    calibration: str | None = None
    calibration_ctx: str | None = None
    #: An importance matrix made by llama-imatrix.
    imatrix: str | None = None

    def spec(self) -> str:
        """The string form (`Q4_K_M,calibration=…`), for messages."""
        fields = (("evaluation", self.evaluation), ("tokens", self.tokens), ("calibration", self.calibration),
                  ("calibration-ctx", self.calibration_ctx), ("imatrix", self.imatrix))
        return ",".join([self.type, *self.budget, *(f"{k}={v}" for k, v in fields if v is not None)])


def parse(raw: RawOptions) -> GGUFOptions:
    """`{"spec": "Q4_K_M,calibration=FILE"}` -> `GGUFOptions(type="Q4_K_M", calibration="FILE")` (F16 when no type
    is given); a part it cannot read is refused."""
    spec = spec_of("gguf", raw, hint="use --to gguf:Q4_K_M") or DEFAULT_TYPE
    head, *rest = [part.strip() for part in spec.split(",")]
    budget: list[str] = []
    fields: dict[str, str] = {}
    for part in rest:
        key, _, value = part.partition("=")
        if key == "evaluation" and value:
            fields["evaluation"] = value
        elif key in ("tokens", "calibration", "calibration-ctx", "imatrix"):
            fields[key.replace("-", "_")] = value
        elif key in quality.KEYS:
            budget.append(part)
        elif part:
            raise UsageError(f"--to gguf:{spec}: cannot read {part!r}", hint=_GRAMMAR)
    return GGUFOptions(type=head, budget=tuple(budget), **fields)


def prepare(options: TargetOptions) -> Prepared:
    """The options recorded (part of the conversion key): the type, the budget and the candidates for auto, the
    evaluation text hashed, the importance matrix's file or text hashed (see imatrix.options); the files
    they name beside them."""
    assert isinstance(options, GGUFOptions)
    check_quantizer()  # the environment's settings, refused before any download rather than mid-write
    direct_io_setting()
    for part in options.budget:
        if part.partition("=")[0] not in quality.KEYS:
            raise UsageError(f"--to gguf:{options.spec()}: cannot read {part!r}", hint=_GRAMMAR)
    importance = {k: v for k, v in (("calibration", options.calibration), ("calibration-ctx", options.calibration_ctx),
                                    ("imatrix", options.imatrix)) if v is not None}
    qtype = options.type.upper()
    budget = list(options.budget)
    if qtype == "AUTO":
        weights, files = imatrix.options("auto", importance)
        try:
            wanted = quality.parse("gguf:" + ",".join(budget)) if budget else dict(auto.DEFAULT_BUDGET)
        except UsageError as e:
            raise UsageError(f"--budget {','.join(budget)}: {str(e).split(': ', 1)[-1]}",
                             hint="e.g. --budget kl=0.02 or --budget ppl=1.02,top1=0.9") from None
        return Prepared("gguf", {"type": "auto", "budget": wanted, "candidates": list(auto.candidates(bool(weights))),
                                 "evaluation": texts.option(options.evaluation or "default", options.tokens),
                                 **weights}, files)
    if qtype not in FILE_TYPES:
        raise UsageError(f"unknown GGUF type {options.type!r}", hint=f"valid types: {', '.join(FILE_TYPES)}, auto")
    if budget:
        raise UsageError(f"a budget ({', '.join(budget)}) chooses a type: it goes with gguf:auto, not {qtype}",
                         hint=f"use --to gguf:auto --budget {','.join(budget)}, or drop the budget")
    weights, files = imatrix.options(qtype, importance)
    out: Options = {"type": qtype, **weights}
    if options.evaluation is not None or options.tokens is not None:
        out["evaluation"] = texts.option(options.evaluation or "default", options.tokens)
    elif qtype not in texts.PROMPT_TYPES:
        out["evaluation"] = texts.option("default", str(texts.implicit_tokens(qtype)))
    return Prepared("gguf", out, files)

