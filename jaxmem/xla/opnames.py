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


# A method's qualified name in the name stack (jax names a jitted or traced call for its function: flax's
# `RngStream.__call__` on its key fold-in): no module of the user's.
_METHOD = re.compile(r"[A-Za-z_]\w*\.__\w+__")


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

    Under a remat the recomputation's name stack starts again, and a lifted transform repeats the
    module's name (and its function's): one module, one path.

    >>> module_path("jit(f)/transpose(jvp(Net))/blk/jvp(Net)/blk/checkpoint/rematted_computation/blk.body/blk/up/dot")
    'Net/blk/up'

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
    names = _split_path(op_name)[:-1]     # the last component is the primitive
    # A remat replays the forward pass in the backward one, name stack and all
    # (transpose(jvp(Net))/block/jvp(Net)/block/checkpoint/...): the last forward start begins the path.
    starts = [i for i, p in enumerate(names) if p.startswith(("jvp(", "transpose(jvp("))]
    out: list[str] = []
    for part in names[starts[-1] if starts else 0:]:
        part = _unwrap(part)
        if not part or part in _SCAFFOLD or "->" in part or "<locals>" in part or _METHOD.fullmatch(part):
            continue   # a Python function's qualified name (jaxmem's own step, flax's RngStream.__call__), not a scope
        if out and (part == out[-1] or part.startswith(out[-1] + ".")):
            continue   # a lifted transform names its module again, or its function (block/block.body)
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
    """'jit(train_step)/jvp()/convert_element_type' -> 'convert_element_type'; 'broadcast.63' -> 'broadcast';
    'jit(f)/transpose(jvp(mul))' -> 'mul' (the primitive inside a transform's wrapper, never its parentheses);
    'broadcast_in_dim:trainable[...]' -> 'broadcast_in_dim' (newer jax appends the argument names)."""
    if not op_name:
        return ""
    last = _split_path(op_name)[-1]
    name = (_unwrap(last) or last).rsplit("/", 1)[-1].split(":", 1)[0]
    return "" if not name or name.startswith("(") else re.sub(r"\.\d+$", "", name)
