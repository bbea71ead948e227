"""The text a GGUF file's quality is measured on: `--evaluation default` (shipped) or a file of one's own.

Every quantized type is measured on it (`default` unless another is named); the lossless types (F32,
F16, BF16), whose check is integrity alone, keep a fixed prompt unless one is asked for. The default,
`data/evaluation.txt`, was written for mreg (English prose about a harbour town and measurement, with
Python, shell and TOML code; about 10 KiB, a few thousand tokens for a 32 K-150 K vocabulary). Only its
first `max_tokens` tokens are evaluated, never past the model's context: 512 (one chunk of llama.cpp's
perplexity tool) when a text is asked for and for gguf:auto, whose choice rests on the figures; 128 when
a named type is measured without being asked, a check that costs a few seconds at 1 B (the reference
pass runs beside the write) rather than one that would double a Q8_0 conversion; 32 for Q8_0, whose
8-bit error sits far inside its budget (a wrong file shows in any 32 tokens; its tensors' encoding
error is checked whatever the text), where 128 tokens were half the CPU of a first conversion: the
reference pass and llama.cpp's evaluation took 11 of 23 CPU-seconds at 1.1 B. The text's sha256 and
the cap are options, so part of the conversion key; the tokens evaluated are recorded with the metrics
(`evaluation_tokens`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from registry.errors import IntegrityError, UsageError
from registry.inputs import decode_text, read_input

DEFAULT = Path(__file__).parent / "data" / "evaluation.txt"
DEFAULT_TOKENS = 512
#: Tokens evaluated for a named quantized type when no evaluation was asked for.
IMPLICIT_TOKENS = 128
#: Types evaluated on fewer tokens when not asked: their error is far inside their budget.
IMPLICIT_TOKENS_OF = {"Q8_0": 32}
#: Types measured on the fixed prompt unless an evaluation text is asked for: their gate is integrity alone.
PROMPT_TYPES = ("F32", "F16", "BF16")
MAX_TOKENS = 1 << 16
#: Larger than any evaluation worth its cost: a wrong path (a checkpoint) is refused before it is read.
MAX_BYTES = 16 << 20
HINT = "use --evaluation default, or a UTF-8 text file of up to 16 MiB"


def _read(path: Path, shown: str) -> bytes:
    data = read_input(path, "--evaluation", limit=MAX_BYTES, hint=HINT)  # a regular file: not /dev/zero, a FIFO
    text = decode_text(data, shown, "--evaluation", hint=HINT)
    if not text.strip():
        raise UsageError(f"--evaluation {shown}: the file is empty", hint=HINT)
    return data


def option(value: str, tokens: str | None) -> dict[str, Any]:
    """`default` or a path, and the token cap -> the normalized option (checked, hashed; part of the key)."""
    try:
        cap = DEFAULT_TOKENS if tokens is None else int(tokens)
    except ValueError:
        cap = 0
    if not 2 <= cap <= MAX_TOKENS:
        raise UsageError(f"--eval-tokens {tokens}: not a number of tokens from 2 to {MAX_TOKENS}",
                         hint=f"e.g. --eval-tokens {DEFAULT_TOKENS}")
    if value == "default":
        return {"text": "default", "sha256": hashlib.sha256(_read(DEFAULT, value)).hexdigest(), "max_tokens": cap}
    path = Path(value).expanduser().resolve()
    digest = hashlib.sha256(_read(path, value)).hexdigest()
    return {"text": path.name, "path": str(path), "sha256": digest, "max_tokens": cap}


def implicit_tokens(qtype: str) -> int:
    """The tokens a named type is evaluated on when no evaluation was asked for."""
    return IMPLICIT_TOKENS_OF.get(qtype, IMPLICIT_TOKENS)


def path_of(opt: dict[str, Any]) -> Path:
    """The file to evaluate on, its bytes still those hashed when the options were read (else IntegrityError)."""
    path = DEFAULT if opt["text"] == "default" else Path(opt["path"])
    got = hashlib.sha256(_read(path, str(path))).hexdigest()
    if got != opt["sha256"]:
        raise IntegrityError(f"the evaluation text {path} changed since the conversion was planned",
                             hint="leave the file alone while mreg converts, and run the command again")
    return path


def describe(opt: dict[str, Any], evaluated: int | None) -> str:
    """One line for the verification's inputs."""
    count = f"{evaluated} tokens" if evaluated is not None else f"up to {opt['max_tokens']} tokens"
    return f"evaluation text {opt['text']} (sha256:{opt['sha256']}), first {count}"
