"""A float16 model run in float32, one module at a time: the reference of a half-precision export, at half its memory.

An fp16 export loads the checkpoint in float16 (a 7B model: 15 GB, not float32's 30). Its
reference is still float32 compute: inside `float32(model)`, each module's own float16 weights and
buffers are replaced by float32 copies just before its forward and put back right after, so that
activations flow in float32 end to end and only the largest single module (an embedding table or
an output projection: 2.2 GB for Qwen2.5-7B) is held twice at any moment.

What that reference is: float32 arithmetic over the float16 weights. For a bfloat16 checkpoint
(most LLMs) that is the checkpoint itself, except for values below float16's normal range (under
6.1e-5 in magnitude, which lose bits) and any above 65,504 (which become Inf and fail the
verification): bfloat16's 8 significant bits fit in float16's 11. For a float32 checkpoint the
weights' rounding to float16 is in the reference, not in the measured difference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def float32(model: Any) -> Iterator[None]:
    """Within the block, `model`'s float16 modules compute in float32 (a no-op for a float32 model)."""
    import torch

    if not any(p.dtype == torch.float16 for p in model.parameters()):
        yield
        return
    handles = []
    for module in model.modules():
        names = [n for n, t in (*module._parameters.items(), *module._buffers.items())
                 if t is not None and t.dtype == torch.float16]
        if not names:
            continue
        kept: dict[str, Any] = {}

        def before(mod: Any, _args: Any, _names: list[str] = names, _kept: dict[str, Any] = kept) -> None:
            for name in _names:
                table = mod._parameters if name in mod._parameters else mod._buffers
                _kept[name] = table[name]
                wide = _kept[name].detach().float()
                table[name] = torch.nn.Parameter(wide, requires_grad=False) if table is mod._parameters else wide

        def after(mod: Any, _args: Any, _out: Any, _kept: dict[str, Any] = kept) -> None:
            for name, original in _kept.items():
                (mod._parameters if name in mod._parameters else mod._buffers)[name] = original
            _kept.clear()

        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after, always_call=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def nonfinite(model: Any) -> dict[str, int]:
    """Parameter name -> its count of Inf/NaN values (only those with any): what float16 could not hold."""
    import torch

    found: dict[str, int] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dtype != torch.float16:
                continue
            n = sum(int((~torch.isfinite(chunk)).sum()) for chunk in param.detach().reshape(-1).split(1 << 22))
            if n:
                found[name] = n
    return found
