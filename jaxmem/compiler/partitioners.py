"""Custom-partitioned ops (``jax.experimental.custom_partitioning``) in a compile that runs in
another process.

Such an op -- cuDNN flash attention (``jax.nn.dot_product_attention(implementation="cudnn")``),
Transformer Engine kernels, ring attention -- lowers to a ``CustomSPMDPartitioning`` custom call
whose ``backend_config`` is a key into a table of Python callbacks held by the process that
lowered it. XLA's SPMD partitioner calls back into Python with that key to ask how the op
shards and to get its per-device body. The compile child of :mod:`jaxmem.compiler.early_stop`
has no such table, so the child forwards each callback to the parent, which answers it with
JAX's own functions, exactly as an in-process compile would have (:func:`serve` in the parent,
:func:`forward_to` in the child). Only shapes, shardings and bytes cross the pipe.

The key is ``id()`` of a Python object, a new number every run: :func:`stable_program_text`
replaces it in the compile cache's key by what the callbacks are (their code and static
arguments), so the same op caches across runs and a changed partitioning rule misses.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import re
import threading
import traceback

import jax
import jax.numpy as jnp
from jax._src import custom_partitioning as cp
from jax._src.lib import xla_client as xc

from jaxmem.errors import in_package

CALL_TARGET = "CustomSPMDPartitioning"
# how the child words a rule's failure, for jaxmem.compiler.compiled to name the user's rule
RULE_FAILED = "custom partitioning rule (answered by the jaxmem parent)"
_KINDS = ("propagate", "partition", "infer")


def _jax_callbacks() -> dict:
    return {"propagate": cp._custom_partitioning_propagate_user_sharding,
            "partition": cp._custom_partitioning_partition,
            "infer": cp._custom_partitioning_infer_sharding_from_operands}


# -- what crosses the pipe: xla_client Shapes and HloShardings as plain data ----------------------

def encode(x):
    if isinstance(x, xc.Shape):
        if x.is_tuple():
            return ("tuple_shape", [encode(s) for s in x.tuple_shapes()])
        return ("shape", x.numpy_dtype().name, tuple(x.dimensions()))
    if isinstance(x, xc.HloSharding):
        return ("sharding", x.to_proto().SerializeToString())
    if isinstance(x, (list, tuple)):
        return ("seq", type(x) is tuple, [encode(v) for v in x])
    return ("value", x)   # bytes, str, None


def decode(e):
    tag = e[0]
    if tag == "tuple_shape":
        return xc.Shape.tuple_shape([decode(s) for s in e[1]])
    if tag == "shape":
        return xc.Shape.array_shape(jnp.dtype(e[1]), e[2])
    if tag == "sharding":
        proto = xc.OpSharding()
        proto.ParseFromString(e[1])
        return xc.HloSharding.from_proto(proto)
    if tag == "seq":
        items = [decode(v) for v in e[2]]
        return tuple(items) if e[1] else items
    return e[1]


# -- the parent: answer a forwarded callback with JAX's own function -------------------------------

def serve(request: dict, answered: dict | None = None) -> tuple:
    """The reply to one forwarded callback: ("ok", encoded result) or ("error", message).

    answered: the replies already given in this compile, by request. JAX's callbacks are functions
    of their arguments (shapes, shardings, the op's key), and an unrolled model asks the same
    question once per layer (gpt2-medium with cuDNN attention: 2 distinct of 48), so a repeated
    question gets the same reply without running the rule again."""
    if answered is not None:
        key = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        if key not in answered:
            answered[key] = serve(request)
        return answered[key]
    try:
        fn = _jax_callbacks()[request["call"]]
        return ("ok", encode(fn(*decode(request["args"]))))
    except Exception as e:  # noqa: BLE001 -- the op's own rule failed: XLA reports it, as it would in process

        return ("error", "".join(traceback.format_exception(e)).strip())


# XLA's words when a partitioning callback raised in process, and the frames of a Python traceback
_IN_PROCESS = "custom_partitioner: Traceback (most recent call last):"
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def rule_failure(xla_message: str) -> str | None:
    """The model's failing partitioning rule, from XLA's error (in process, or answered by the
    parent): the exception and the frames of the rule's own code. None if that is not what failed."""
    for marker in (RULE_FAILED, _IN_PROCESS):
        if marker in xla_message:
            text = xla_message[xla_message.rindex(marker) + len(marker):]
            break
    else:
        return None
    text = text.split("Suspected Python Code Location:")[0]
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]

    jax_dir = os.path.dirname(os.path.abspath(jax.__file__))   # jax's and jaxmem's own frames, by where they live
    frames = [f"{m.group(1)}:{m.group(2)} in {m.group(3)}" for ln in lines if (m := _FRAME.search(ln))
              and not in_package(m.group(1)) and not in_package(m.group(1), jax_dir)]
    error = next((ln for ln in reversed(lines) if not ln.startswith(("File ", "Traceback"))
                  and not _FRAME.search(ln)), "")
    return error[:1000] + (f" (at {', '.join(frames[-3:])})" if frames else "")


# -- the child: forward JAX's registered callbacks to the parent -----------------------------------

class _Remote:
    def __init__(self, send, replies):
        self.send, self.replies, self.lock = send, replies, threading.Lock()

    def __call__(self, kind: str, *args):
        with self.lock:   # one question at a time: replies come back in order
            self.send({"call": kind, "args": encode(args)})
            status, payload = self.replies.get()
        if status != "ok":
            raise RuntimeError(f"{RULE_FAILED}:\n{payload}")
        return decode(payload)


# The forwarders' code runs with the globals of jax's custom_partitioning module, where forward_to
# puts `_jaxmem_remote`: a name neither checker can see from here.

def _propagate(user_sharding, shape, backend_string):
    return _jaxmem_remote("propagate", user_sharding, shape, backend_string)  # type: ignore[name-defined]  # noqa: F821


def _partition(arg_shapes, arg_shardings, result_shape, result_sharding, backend_string):
    return _jaxmem_remote(  # type: ignore[name-defined]  # noqa: F821
        "partition", arg_shapes, arg_shardings, result_shape, result_sharding, backend_string)


def _infer(arg_shapes, arg_shardings, result_shape, backend_string):
    return _jaxmem_remote("infer", arg_shapes, arg_shardings, result_shape, backend_string)  # type: ignore[name-defined]  # noqa: F821


def forward_to(send, replies) -> None:
    """In the compile child: make JAX's registered partitioner callbacks ask the parent.

    XLA holds the function objects JAX registered at import (for the CUDA plugin too), so their
    code is swapped in place; the forwarders read ``_jaxmem_remote`` from that module's globals.
    send: writes one message to the parent; replies: a queue of the parent's answers.
    """

    cp._jaxmem_remote = _Remote(send, replies)  # type: ignore[attr-defined]  # a global of our own in jax's module
    for kind, fwd in zip(_KINDS, (_propagate, _partition, _infer), strict=True):
        _jax_callbacks()[kind].__code__ = fwd.__code__


# -- the cache key -------------------------------------------------------------------------------

_CALL = re.compile(r'(stablehlo\.custom_call @' + CALL_TARGET + r'\(.*?backend_config = ")([^"]*)(")')


def stable_program_text(text: str) -> str:
    """`text` (a lowered module) with each custom-partitioning key replaced by a fingerprint of
    its callbacks: the rules' code and static arguments, which decide what XLA is given."""
    if CALL_TARGET not in text:
        return text

    def fingerprint(m: re.Match) -> str:
        info = cp._sharding_callbacks.get(m.group(2).encode())
        if info is None:   # not ours to read: keep the key (a miss, never a wrong hit)
            return m.group(0)
        h = hashlib.sha256()
        for fn in (info.partition, info.infer_sharding_from_operands, info.propagate_user_sharding):
            h.update(_code_identity(fn).encode())
        h.update(repr(info.static_args).encode())
        h.update(repr(info.mesh).encode())
        return m.group(1) + "cp:" + h.hexdigest()[:32] + m.group(3)

    return _CALL.sub(fingerprint, text)


def _code_identity(fn) -> str:
    """What a callback computes: its qualified name, bytecode and constants (and of what it wraps)."""

    if fn is None:
        return "None"
    if isinstance(fn, functools.partial):
        return f"partial({_code_identity(fn.func)}, {fn.args!r}, {sorted(fn.keywords.items())!r})"
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    return f"{fn.__module__}.{fn.__qualname__}:{_code_text(code)}"


def _code_text(code) -> str:
    # nested functions' code objects print with their address: spelled out instead
    consts = ",".join(_code_text(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts)
    return f"{code.co_code.hex()}[{consts}]"
