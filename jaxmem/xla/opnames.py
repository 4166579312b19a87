"""What an HLO instruction's ``op_name`` metadata says: the Flax module path, forward or backward,
and which opcodes are collectives."""

from __future__ import annotations

import re

# Path components JAX adds that are not the user's scopes: loop and call scaffolding.
_SCAFFOLD = frozenset({
    "while", "body", "cond", "branch", "checkpoint", "remat", "rematted_computation",
    "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
    "shard_map", "scan",
    "eval_jaxpr",   # jax 0.11+: the body of a scan (nn.scan's layers/eval_jaxpr/attn is layers/attn)
})
_CALL = re.compile(r"^([\w.\-]+)\((.*)\)$")
# Wrappers naming a called *function*, not a scope: the whole component goes.
_FUNCTION_WRAPPERS = frozenset({"jit", "pjit", "xla_call", "xla_pmap", "pmap", "custom_jvp", "custom_vjp"})


def _split_path(op_name: str) -> list[str]:
    """Split at '/' outside parentheses (a wrapper's argument may hold a '/')."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(op_name):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "/" and depth == 0:
            parts.append(op_name[start:i])
            start = i + 1
    parts.append(op_name[start:])
    return parts


def _unwrap(part: str) -> str:
    """'transpose(jvp(layers))' -> 'layers'; 'jvp()' -> ''; 'jit(step)' -> ''."""
    while True:
        m = _CALL.match(part)
        if m is None:
            return part
        if m.group(1) in _FUNCTION_WRAPPERS:
            return ""
        part = m.group(2)


def module_path(op_name: str) -> str:
    """The user's scope path in a JAX ``op_name``: the final primitive name, transform
    wrappers, called-function names (``jit(...)``), loop / remat scaffolding and einsum
    equations removed.

    JAX writes a transform around the first scope traced under it: ``jvp(Llama)``,
    ``transpose(jvp(layers))``, ``jvp()`` when there is none; that scope is kept.

    >>> module_path("jit(step)/transpose(jvp(Llama))/layers/attn/dot_general")
    'Llama/layers/attn'
    >>> module_path("jit(step)/jvp(layers)/while/body/closed_call/attn/bthd,bshd->bhts/dot_general")
    'layers/attn'
    >>> module_path("jit(step)/jvp()/mul")
    ''

    XLA joins the op_names of instructions it merged with ``;``: the result is the longest
    scope prefix their (non-empty) paths share.

    >>> module_path("jit(f)/jvp(Net)/block0/up/add;jit(f)/jvp(Net)/block0/mlp/add;jit(f)/jvp()/mul")
    'Net/block0'
    """
    if ";" in op_name:
        paths = {module_path(piece) for piece in op_name.split(";")} - {""}
        if not paths:
            return ""
        split = [p.split("/") for p in paths]
        common = []
        for parts in zip(*split, strict=False):  # up to the shortest path
            if len(set(parts)) != 1:
                break
            common.append(parts[0])
        return "/".join(common)
    if not op_name or "/" not in op_name:
        return ""
    out = []
    for part in _split_path(op_name)[:-1]:     # the last component is the primitive
        part = _unwrap(part)
        if part and part not in _SCAFFOLD and "->" not in part:
            out.append(part)
    return "/".join(out)


def is_backward(op_name: str) -> bool:
    return "transpose(" in op_name



COLLECTIVES = frozenset({
    "all-gather", "all-gather-start", "all-gather-done",
    "all-reduce", "all-reduce-start", "all-reduce-done",
    "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-permute-start", "collective-permute-done",
    "collective-broadcast",
})
ASYNC = frozenset({"async-start", "async-update", "async-done"})


def primitive(op_name: str) -> str:
    """'jit(train_step)/jvp()/convert_element_type' -> 'convert_element_type'; 'broadcast.63' -> 'broadcast'."""
    return re.sub(r"\.\d+$", "", op_name.rsplit("/", 1)[-1]) if op_name else ""
