"""Equinox (and plain-JAX) models as a :class:`~jaxmem.program.workload.Workload`: the training step an
Equinox trainer writes, built from a model, a loss and an optax optimizer (``jaxmem.equinox_workload``).

The step is a custom one (``Workload(step=..., state=...)``): the model's floating-point arrays are the
trained parameters, its other arrays ride along in the state untouched (``buffers``), everything else
is static. The split keeps abstract leaves: a model made under ``eqx.filter_eval_shape`` holds
``jax.ShapeDtypeStruct`` leaves, which ``eqx.is_array`` (and so ``eqx.is_inexact_array``) drop as
non-arrays -- a trap for a hand-written step, where the parameters would silently go missing.

While the step is traced, every Equinox module class in the model has its ``__call__`` wrapped (for
that trace only), as jaxmem.program.calls wraps NNX modules:

* a ``jax.named_scope`` of the module's attribute path relative to its caller (``blocks/3/attn``; the
  root named by its class, list and dict entries by their index or key), so buffers are named by the
  module that made them, and the loss's own ops by the loss function's name;
* under ``--remat-at REGEX`` (or ``remat_at=``), the calls of the modules whose class name or path the
  regex finds are checkpointed with the ``--remat`` policy (``eqx.filter_checkpoint``), the outermost
  match only; jaxmem.program.calls.CallLog records where, and a regex that finds none is exit 2.

A module called inside a ``jax.lax.scan`` over stacked layers is a new object made from the scanned
arrays: it is named (and matched) by its class.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxmem.errors import UserError
from jaxmem.program import calls as calls_mod
from jaxmem.program.workload import Workload, is_equinox_module

_INSIDE = contextvars.ContextVar("jaxmem_eqx_inside_checkpoint", default=False)
_STACK: contextvars.ContextVar[tuple] = contextvars.ContextVar("jaxmem_eqx_scopes", default=())

def _eqx():
    try:
        import equinox as eqx  # noqa: PLC0415 - equinox is optional: loaded only by an Equinox workload
    except ImportError:
        raise UserError("jaxmem.equinox_workload needs equinox: pip install equinox") from None
    return eqx


def _is_array(x: Any) -> bool:
    """An array or an abstract one (jax.ShapeDtypeStruct): what eqx.is_array misses."""
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) or (hasattr(x, "shape") and hasattr(x, "dtype")
                                                                and not isinstance(x, type))


def is_inexact(x: Any) -> bool:
    """A floating-point (or complex) array, concrete or abstract: the trained parameters."""
    return _is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def equinox_workload(model: Any, loss: Callable[[Any, Any], Any], optimizer: Any, batch: Any, *,
                     name: str | None = None, remat_at: str | None = None, donate: bool = True,
                     checkpoint_dtype: str | None = None) -> Workload:
    """The Workload of an Equinox model's training step: ``loss(model, batch)``'s gradient with respect to
    the model's floating-point arrays, ``optimizer`` (optax) updating them, the state donated.

    model: an ``equinox.Module``; build it abstractly (``eqx.filter_eval_shape(Model, ..., key=...)``) so that
        no parameter is allocated. batch: a pytree of ``jax.ShapeDtypeStruct``, the global batch.
    remat_at: the modules to checkpoint (class name or path regex, e.g. ``"Block"`` or ``r"blocks/\\d+$"``)
        under ``--remat`` (``--remat-at`` overrides it). name: the report's model name (default: the
        model's class).
    """
    eqx = _eqx()
    if not is_equinox_module(model):
        raise UserError(f"jaxmem.equinox_workload: model is a {type(model).__name__}, not an equinox.Module")
    if not callable(loss):
        raise UserError("jaxmem.equinox_workload: loss must be loss(model, batch) -> scalar")
    params, rest = eqx.partition(model, is_inexact)
    buffers, static = eqx.partition(rest, _is_array)
    if not jax.tree.leaves(params):
        raise UserError(f"jaxmem.equinox_workload: {type(model).__name__} has no floating-point arrays to train")
    params, buffers = _abstract(params), _abstract(buffers)
    state: dict[str, Any] = {"params": params, "opt_state": jax.eval_shape(optimizer.init, params)}
    if jax.tree.leaves(buffers):
        state["buffers"] = buffers
    root = type(model).__name__
    loss_name = getattr(loss, "__name__", "loss")

    def step(st, b):
        def objective(p):
            m = eqx.combine(p, st.get("buffers", buffers), static)
            with module_calls(m, eqx), jax.named_scope(loss_name):
                return loss(m, b)

        value, grads = jax.value_and_grad(objective)(st["params"])
        updates, opt_state = optimizer.update(grads, st["opt_state"], st["params"])
        new = {**st, "params": eqx.apply_updates(st["params"], updates), "opt_state": opt_state}
        return new, value

    return Workload(step=step, state=state, batch=batch, name=name or root, remat_at=remat_at, donate=donate,
                    checkpoint_dtype=checkpoint_dtype)


@contextlib.contextmanager
def module_calls(model, eqx):
    """While active, each Equinox module class in `model` has its ``__call__`` wrapped: its named scope,
    and the checkpoint where the custom step's --remat-at finds it (calls.CUSTOM, set by jaxmem while
    the step is traced)."""
    paths = _paths(model, eqx)
    classes = {type(m) for m in _modules(model, eqx)}
    originals = {cls: next((c.__dict__["__call__"] for c in cls.__mro__ if "__call__" in c.__dict__), None)
                 for cls in classes}
    had_own = {cls: "__call__" in cls.__dict__ for cls in classes}
    calls = _Calls(paths, type(model).__name__, eqx, calls_mod.CUSTOM.get())
    for cls, orig in originals.items():
        if orig is None:
            continue

        def wrapped(self, *a, __orig=orig, **k):
            return calls.call(self, __orig, a, k)

        setattr(cls, "__call__", wrapped)   # noqa: B010 -- for this trace only: restored below
    try:
        yield
    finally:
        for cls, orig in originals.items():
            if orig is None:
                continue
            if had_own[cls]:
                setattr(cls, "__call__", orig)   # noqa: B010 -- the class's own, as it was
            else:
                delattr(cls, "__call__")


def _children(node, eqx):
    """(name, child) for the fields of a module and the entries of lists, tuples and dicts."""
    if isinstance(node, eqx.Module):
        return [(f.name, getattr(node, f.name, None)) for f in dataclasses.fields(node)]
    if isinstance(node, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(node)]
    if isinstance(node, dict):
        return [(str(k), v) for k, v in node.items()]
    return []


def _modules(model, eqx):
    return [m for _, m in _walk(model, (), eqx)]


def _walk(node, path: tuple[str, ...], eqx, depth: int = 0):
    if depth > 64:
        return
    if isinstance(node, eqx.Module):
        yield path, node
    for name, child in _children(node, eqx):
        yield from _walk(child, (*path, name), eqx, depth + 1)


def _paths(model, eqx) -> dict[int, tuple[str, ...]]:
    return {id(m): p for p, m in _walk(model, (), eqx)}


class _Calls:
    """One trace's module calls: each named by its path below its caller's, checkpointed where the
    custom step's --remat-at pattern finds it."""

    def __init__(self, paths: dict[int, tuple[str, ...]], root: str, eqx, custom: tuple | None):
        self.paths, self.root, self.eqx = paths, root, eqx
        self.held: list = []   # the copies registered, kept alive: no id is reused during the trace
        self.pattern, self.policy, self.log = custom if custom is not None else (None, None, None)

    def call(self, module, orig, a, k):
        path = self.paths.get(id(module))
        cls_name = type(module).__name__
        path_s = "/".join(path) if path is not None else cls_name   # a scanned copy: named by its class
        stack = _STACK.get()
        if not stack:
            scope = self.root
        elif path is None:
            scope = cls_name
        else:
            parent = stack[-1]
            rel = path[len(parent):] if parent is not None and path[:len(parent)] == parent else path
            scope = "/".join(rel) or cls_name
        if self.log is not None:
            self.log.saw(cls_name, path_s)
        token = _STACK.set((*stack, path))
        try:
            with jax.named_scope(scope):
                if (self.pattern is not None and not _INSIDE.get()
                        and calls_mod.matches(self.pattern, cls_name, path_s)):
                    self.log.placed.add(path_s or self.root)
                    return self.remat(module, orig, a, k, path)
                return orig(module, *a, **k)
        finally:
            _STACK.reset(token)

    def remat(self, module, orig, a, k, path):
        def body(mdl, args, kwargs):
            if path is not None:   # the checkpoint hands the call a copy of the module: its paths are the same
                self.held.append(mdl)
                self.paths.update({id(m): (*path, *p) for p, m in _walk(mdl, (), self.eqx)})
            token = _INSIDE.set(True)   # the matches inside a checkpointed call are already inside it
            try:
                return orig(mdl, *args, **kwargs)
            finally:
                _INSIDE.reset(token)

        return self.eqx.filter_checkpoint(body, policy=self.policy)(module, a, k)
