"""FLOP formulas that torch's FlopCounterMode lacks, registered through its own registry.

torch 2.13's counter knows the CUDA attention kernels but not the CPU one that
``scaled_dot_product_attention`` dispatches to on CPU, so attention would count as zero FLOPs
there. We register torch's own SDPA formula for it (and for its backward) when it is missing.
"""

from __future__ import annotations

import torch
from torch.utils import flop_counter

_aten = torch.ops.aten


def _register_missing() -> None:
    # CPU kernel -> the CUDA flash kernel whose registered formula it shares (same leading
    # arguments: query, key, value for the forward; grad_out, query, key, value for the backward).
    pairs = [
        ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"),
        ("_scaled_dot_product_flash_attention_for_cpu_backward",
         "_scaled_dot_product_flash_attention_backward"),
    ]
    for op_name, known_name in pairs:
        op = getattr(_aten, op_name, None)
        known = getattr(_aten, known_name, None)
        formula = flop_counter.flop_registry.get(known) if known is not None else None
        if op is None or formula is None or op in flop_counter.flop_registry:
            continue
        # The registered formula already takes shapes: register it raw, unwrapped again.
        flop_counter.register_flop_formula(op, get_raw=True)(formula)


_register_missing()
