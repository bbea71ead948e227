"""Mixture-of-experts layers in a form the TorchScript exporter can trace: every expert, in order, on the tokens
routed to it.

transformers 5's experts modules (Qwen3-MoE, Qwen2-MoE, Mixtral: weights stacked as `gate_up_proj`
(experts, 2 x intermediate, hidden) and `down_proj` (experts, hidden, intermediate)) loop in Python
over the experts that the batch's tokens were routed to. A trace records the loop for the
example's routing only: another prompt routed elsewhere would run the wrong experts. Here each
experts module, while (and only while) the calling thread traces, runs every expert in a loop of
fixed length; each expert gathers the tokens routed to it (ONNX `NonZero` + `Gather`, so a dynamic
count, zero included), runs its two projections on those rows only and adds the weighted result
back (`ScatterND`-style index_add). Work is what the routing asks for (top-k experts per token, as
in transformers) plus a few small ops per idle expert: at Qwen3-30B-A3B's 128 experts and 48
layers that is 6,144 expert blocks in the graph, each skipped at the cost of an empty gather. The
sums are in the same order as transformers' (ascending expert index), so the export matches it
to float32 rounding.

The PyTorch reference that runs beside the trace (another thread) sees transformers' own forward:
the swap is decided per call by `torch.jit.is_tracing()`, which is per thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def _stacked(module: Any) -> bool:
    """An experts module with transformers 5's stacked, concatenated [gate; up] layout and no biases."""
    import torch

    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (isinstance(gate_up, torch.nn.Parameter) and isinstance(down, torch.nn.Parameter)
            and gate_up.dim() == 3 and down.dim() == 3 and hasattr(module, "act_fn")
            and not getattr(module, "has_bias", False) and not getattr(module, "is_transposed", False)
            and getattr(module, "is_concatenated", True) and getattr(module, "has_gate", True))


def _every_expert(module: Any, hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The experts' output for `hidden` (tokens, hidden), each expert on the tokens routed to it."""
    import torch
    from torch.nn import functional

    out = torch.zeros_like(hidden)
    for expert in range(int(module.gate_up_proj.shape[0])):
        token, slot = torch.nonzero(top_k_index == expert, as_tuple=True)
        gate, up = functional.linear(hidden[token], module.gate_up_proj[expert]).chunk(2, dim=-1)
        rows = functional.linear(module.act_fn(gate) * up, module.down_proj[expert])
        out = out.index_add(0, token, (rows * top_k_weights[token, slot, None]).to(out.dtype))
    return out


def count(model: Any) -> int:
    """How many experts modules of the traceable layout the model has."""
    return sum(1 for m in model.modules() if _stacked(m))


@contextlib.contextmanager
def traceable(model: Any) -> Iterator[int]:
    """Within the block, the model's experts modules run every expert when the calling thread traces; yields how
    many modules were swapped."""
    import torch

    jit: Any = torch.jit  # (is_tracing is public, but untyped and not re-exported in the stubs)
    swapped = []
    for module in model.modules():
        if not _stacked(module):
            continue
        own = module.forward

        def forward(hidden: Any, top_k_index: Any, top_k_weights: Any, _m: Any = module, _own: Any = own) -> Any:
            if jit.is_tracing() or torch.compiler.is_exporting():
                return _every_expert(_m, hidden, top_k_index, top_k_weights)
            return _own(hidden, top_k_index, top_k_weights)

        module.forward = forward
        swapped.append(module)
    try:
        yield len(swapped)
    finally:
        for module in swapped:
            del module.forward  # the instance attribute: the class's forward again
