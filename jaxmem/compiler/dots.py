"""The dots of an optimized HLO module: their kind (the tensor-core rate they run at), FLOPs and shapes,
custom calls' FLOPs (cuDNN attention). Read by the step-time estimate and the kernel list alike."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence

from jaxmem.xla import hlo_text

_ALGORITHMS = (("dot_any_f8_any_f8", "fp8"), ("dot_bf16_bf16", "bf16"), ("dot_f16_f16", "fp16"),
               ("dot_tf32_tf32", "tf32"), ("dot_f32_f32", "fp32"), ("dot_f64_f64", "other"))
_INT8 = ("s8", "u8", "s4", "u4")


def dot_kind(dtypes: list[str], precision: Sequence[str] = (), algorithm: str | None = None) -> tuple[str, int]:
    """(kind, passes): the rate a dot with operands of `dtypes` runs at, and how many times.

    The kinds: bf16, fp16, tf32, fp32 (CUDA cores), fp8, int8, other (f64 and wide integers: no
    tensor-core rate in the catalogue). An explicit algorithm decides; else the widest operand: fp32
    runs in TF32 unless an operand's precision is HIGHEST (JAX's DEFAULT and HIGH both give TF32 on GPU).
    """
    if algorithm:
        a = algorithm.lower().removeprefix("alg_")
        for prefix, kind in _ALGORITHMS:
            if a.startswith(prefix):
                m = re.search(r"_x(\d+)$", a)
                return kind, int(m.group(1)) if m else 1
    dts = set(dtypes)
    if not dts or dts - {"f32", "bf16", "f16", *_INT8} - {d for d in dts if d.startswith("f8")}:
        return "other", 1
    if "f32" in dts:
        return ("fp32" if any(p.lower() == "highest" for p in precision) else "tf32"), 1
    if "bf16" in dts:
        return "bf16", 1
    if "f16" in dts:
        return "fp16", 1
    if all(d.startswith("f8") for d in dts):
        return "fp8", 1
    if dts <= set(_INT8):
        return "int8", 1
    return "other", 1   # fp8 with int8 operands: no single rate


def _dims_attr(ins: hlo_text.Instruction, key: str) -> list[int]:
    text = ins.attr(key) or ""
    return [int(x) for x in re.findall(r"\d+", text)]


def loop_dot_share(module: hlo_text.Module, trip_count: int) -> float:
    """The share of the step's dot FLOPs run inside the while loops of `trip_count` iterations (and
    the computations they call): a pipeline's stage loops, forward and backward."""
    mult = module.multiplicity
    per_comp: dict[str, float] = defaultdict(float)   # computation -> its dots' FLOPs per step
    for ins, flops, _ in _dots(module):
        per_comp[ins.computation] += flops * mult.get(ins.computation, 0)
    total = sum(per_comp.values())
    if not total:
        return 0.0
    inside: set[str] = set()
    stack = [dict(ins.called).get("body") for ins in module.instructions()
             if ins.opcode == "while" and module.trip_counts.get(ins.name) == trip_count]
    while stack:
        name = stack.pop()
        if name is None or name in inside or name not in module.computations:
            continue
        inside.add(name)
        stack.extend(callee for ins in module.computations[name].instructions for _, callee in ins.called)
    return sum(f for c, f in per_comp.items() if c in inside) / total


def _dots(module: hlo_text.Module):
    """(instruction, FLOPs of one run, (kind, passes)) of every dot and GEMM / attention custom call
    that runs in the step."""
    mult = module.multiplicity
    for ins in module.instructions():
        if not mult.get(ins.computation, 0) or ins.opcode not in ("dot", "custom-call"):
            continue
        arrays = [a for a in _operand_shapes(module, ins) if isinstance(a, hlo_text.Array)]
        if len(arrays) < 2:
            continue
        if ins.opcode == "dot":
            dn = {f"{side}_{what}_dimensions": _dims_attr(ins, f"{side}_{what}_dims")
                  for side in ("lhs", "rhs") for what in ("contracting", "batch")}
            precision = re.findall(r"[a-z]+", ins.attr("operand_precision") or "")
            yield ins, _dot_flops(arrays[0], arrays[1], dn), dot_kind([a.dtype for a in arrays[:2]], precision,
                                                                       ins.attr("algorithm"))
        else:
            flops = _custom_call_flops(module, ins)
            if not flops:
                continue
            pc = ins.backend_config.get("gemm_backend_config", {}).get("precision_config", {})
            alg = pc.get("algorithm")
            yield ins, flops, dot_kind([a.dtype for a in arrays[:2]], pc.get("operand_precision", []),
                                       None if alg in (None, "ALG_UNSET") else alg)


def dot_flops(module: hlo_text.Module) -> tuple[tuple[str, int, float], ...]:
    """FLOPs per step of every dot and GEMM / attention custom call, by (kind, passes) (see :func:`dot_kind`).

    A dot inside a fusion (Triton GEMM fusions hold theirs) counts as often as its fusion runs.
    """
    mult = module.multiplicity
    out: dict[tuple[str, int], float] = defaultdict(float)
    for ins, flops, kind in _dots(module):
        out[kind] += flops * mult.get(ins.computation, 0)
    return tuple((k, p, f) for (k, p), f in sorted(out.items()))


def _operand_shapes(module: hlo_text.Module, ins: hlo_text.Instruction) -> list:
    by_name = module.by_name
    return [by_name[n].shape if n in by_name else None for n in re.findall(r"%([\w.\-]+)", ins.operands)]


def _dims(d: dict, key: str) -> list[int]:
    return [int(x) for x in d.get(key, [])]


def _dot_flops(lhs: hlo_text.Array, rhs: hlo_text.Array, dn: dict) -> float:
    """2 x batch x lhs-free x rhs-free x contracted, from XLA dot dimension numbers."""
    lc, rc = _dims(dn, "lhs_contracting_dimensions"), _dims(dn, "rhs_contracting_dimensions")
    lb, rb = _dims(dn, "lhs_batch_dimensions"), _dims(dn, "rhs_batch_dimensions")
    batch = math.prod(lhs.dims[i] for i in lb)
    contract = math.prod(lhs.dims[i] for i in lc)
    lfree = math.prod(d for i, d in enumerate(lhs.dims) if i not in lc and i not in lb)
    rfree = math.prod(d for i, d in enumerate(rhs.dims) if i not in rc and i not in rb)
    return 2.0 * batch * lfree * rfree * contract


# Q·Kᵀ for (batch, seq, heads, head_dim) operands: contract head_dim, batch over batch and heads.
_BTHD_SCORES = {"lhs_contracting_dimensions": [3], "rhs_contracting_dimensions": [3],
                "lhs_batch_dimensions": [0, 2], "rhs_batch_dimensions": [0, 2]}


def _custom_call_flops(module: hlo_text.Module, ins: hlo_text.Instruction) -> float:
    """FLOPs of the custom calls XLA's cost analysis counts as zero.

    cuBLAS GEMMs (``__cublas$gemm``, ``__cublas$lt$matmul``, ``...$f8``): from the operand shapes and
    the dot dimension numbers in their backend config. cuDNN fused attention
    (``__cudnn$fmha*``): the forward pass is two GEMMs of the size of Q·Kᵀ (scores, then
    probabilities·V), the backward five (recomputed scores, dV, dP, dQ, dK); a causal mask
    halves both, as cuDNN skips the masked tiles.
    """
    target = (ins.attr("custom_call_target") or "").strip('"')
    cfg = ins.backend_config
    shapes = _operand_shapes(module, ins)
    arrays = [s for s in shapes if isinstance(s, hlo_text.Array)]
    # cuBLASLt's targets: ``__cublas$lt$matmul`` and its FP8 form ``__cublas$lt$matmul$f8`` (operands A, B,
    # then the scales): XLA rewrites FP8 dots of GEMM size into the latter
    if (target.startswith("__cublas$") and "gemm" in target.lower()) or target.startswith("__cublas$lt$matmul"):
        dn = cfg.get("gemm_backend_config", {}).get("dot_dimension_numbers")
        if dn is None or len(arrays) < 2:
            return 0.0
        return _dot_flops(arrays[0], arrays[1], dn)
    if target.startswith("__cudnn$fmha"):
        fmha = cfg.get("cudnn_fmha_backend_config", {})
        if len(arrays) < 2:
            return 0.0
        backward = "Backward" in target
        # Q·Kᵀ from operands 0 and 1 (Q, K in both directions). The backward config names only its
        # gradient GEMMs; Q and K then come in jax's (batch, seq, heads, head_dim) order.
        dn = fmha.get("bmm1_dot_dimension_numbers", _BTHD_SCORES)
        one = _dot_flops(arrays[0], arrays[1], dn)
        causal = str(fmha.get("mask_type", "")).upper() == "CAUSAL"
        return one * (5 if backward else 2) * (0.5 if causal else 1.0)
    return 0.0
