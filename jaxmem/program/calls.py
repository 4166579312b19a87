"""What jaxmem wraps around a model's module calls while its step is traced.

* **Names for NNX.** linen writes each module call's path into XLA's ``op_name`` metadata
  itself; NNX does not, so without ``jax.named_scope`` in the model every buffer is "(no module:
  ...)". While the step is traced, each NNX module's ``__call__`` enters a named scope of its
  attribute path relative to the module that called it (``layers/3/attn``), the root named by its
  class as linen's top module is. Under a scope the model opened itself (models/vit.py names its
  blocks) jaxmem adds none: the model's own names stand.
* **Checkpoints without a hook** (``--remat-at REGEX``, ``Workload(remat_at=...)``). The calls of
  the linen or NNX modules whose class name or module path the regex finds (``re.search``, matched by
  RE2: jaxmem.program.patterns) run
  under the ``--remat`` policy: linen through ``nn.intercept_methods`` and ``nn.checkpoint``, NNX
  through ``nnx.remat``. Only the outermost match is checkpointed (a match inside a checkpointed
  call is already inside it). :class:`CallLog` records where checkpoints went, for the report.

* **Collective axes written for pmap** (``BatchNorm(axis_name="batch")``, ``lax.pmean(x, "batch")``).
  Under jit such a name is unbound. The loss then runs once per data-parallel device group, as
  pmap runs it: ``jax.vmap`` over the groups with the model's axis name, ``spmd_axis_name`` the
  mesh's batch axes, so the collective is an all-reduce over those devices in the program.

Arguments that are not arrays (``train=True``, ``deterministic``) are closed over rather than
traced, so a module's Python control flow on them still works under the checkpoint.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax._src import source_info_util

from jaxmem.errors import UserError, clip
from jaxmem.program import patterns

_INSIDE = contextvars.ContextVar("jaxmem_inside_checkpoint", default=False)
_LIFTED: contextvars.ContextVar[frozenset] = contextvars.ContextVar("jaxmem_lifted_outer", default=frozenset())
_STACK: contextvars.ContextVar[tuple] = contextvars.ContextVar("jaxmem_nnx_scopes", default=())


@dataclasses.dataclass
class CallLog:
    """Filled while the step is traced: the module paths checkpointed, and every module seen
    (class name -> a path), for the report and for the error when the regex finds none."""

    remat_at: str | None = None
    unapplied: str | None = None   # a --remat-at the model's own remat hook overrides: it must still find a module
    collective_axis: str | None = None   # the pmap-style axis name the model's collectives use, bound per group
    custom: bool = False   # a custom step's (Workload(step=...)): its error names the hook to write
    placed: set[str] = dataclasses.field(default_factory=set)
    seen: dict[str, set[str]] = dataclasses.field(default_factory=dict)   # class name -> its module paths

    def saw(self, cls_name: str, path: str) -> None:
        self.seen.setdefault(cls_name, set()).add(path)

    def repeated_block(self) -> str | None:
        """The model's repeated block, to checkpoint when it has no remat hook of its own: a class
        of modules that hold other modules, not the root, with the most instances (a scanned layer is
        one instance), the outermost on a tie. None when there is none."""
        paths = {p for ps in self.seen.values() for p in ps}

        def has_children(p: str) -> bool:
            return any(q.startswith(p + "/") for q in paths)

        blocks = [(len(ps), -min(p.count("/") for p in ps), c) for c, ps in self.seen.items()
                  if all(ps) and any(has_children(p) for p in ps)]
        return max(blocks)[2] if blocks else None

    def check(self) -> None:
        """After the trace: a --remat-at that found no module is the user's error (before the compile),
        applied or not (a model with its own remat hook: the pattern still has to name its modules)."""
        if self.remat_at is not None and not self.placed:
            raise UserError(self._finds_nothing(self.remat_at))
        if self.unapplied is not None:
            rx = patterns.compile_pattern(self.unapplied, "--remat-at")
            if not any(rx.search(c) or any(rx.search(p) for p in ps) for c, ps in self.seen.items()):
                raise UserError(self._finds_nothing(self.unapplied) + " (the model's workload() takes `remat` and "
                                "places its own checkpoints, so --remat-at is not applied; drop it)")

    def _finds_nothing(self, remat_at: str) -> str:
        shown = ", ".join(f"{c} ({min(ps)})" if min(ps) else c for c, ps in list(self.seen.items())[:12]) \
            or "none was called"
        if self.custom:
            return (f"--remat-at {clip(repr(remat_at))} finds no module in the step (searched in the class name and "
                    "path of each linen module it calls, and of each Equinox module of jaxmem.equinox_workload); "
                    f"its modules: {shown}. This workload gives its own `step`, so jaxmem can place checkpoints only "
                    "there: name one of those modules, or write the hook yourself -- take `remat` in workload(remat="
                    "'none') and wrap the layers your step calls in jax.checkpoint(layer, "
                    "policy=jaxmem.remat_policy(remat)) -- and drop --remat-at")
        return (f"--remat-at {clip(repr(remat_at))} finds no module of the model (searched in each module's class "
                f"name and path); its modules: {shown}")


def matches(pattern, cls_name: str, path: str) -> bool:   # an RE2 pattern (jaxmem.program.patterns)
    return pattern is not None and bool(pattern.search(cls_name) or pattern.search(path))


def _split_static(args: tuple, kwargs: dict, keep=lambda x: False):
    """(dynamic array leaves, rebuild(leaves) -> (args, kwargs)): what a checkpoint traces, and
    the rest closed over."""
    leaves, treedef = jax.tree.flatten((args, kwargs), is_leaf=keep)
    dyn = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not keep(x)]

    def rebuild(values):
        full = list(leaves)
        for i, v in zip(dyn, values, strict=True):
            full[i] = v
        return jax.tree.unflatten(treedef, full)

    return [leaves[i] for i in dyn], rebuild


@contextlib.contextmanager
def linen_calls(remat_at: str | None, policy, log: CallLog):
    """While active, the linen module calls are recorded in `log`, and those `remat_at` finds are
    checkpointed with `policy`."""

    pattern = patterns.compile_pattern(remat_at, "--remat-at") if remat_at is not None else None

    def interceptor(next_fun, args, kwargs, context):
        m = context.module
        if context.method_name != "__call__" or _INSIDE.get():
            return next_fun(*args, **kwargs)
        path = "/".join(map(str, m.path))
        name = _lifted_base(type(m))
        if name is not None and path not in _LIFTED.get():
            # nn.scan(Layer) and its kind: the outer call sets up the loop; the layer's body is the
            # inner call of the same module, which is what a checkpoint goes around (per iteration)
            token = _LIFTED.set(_LIFTED.get() | {path})
            try:
                return next_fun(*args, **kwargs)
            finally:
                _LIFTED.reset(token)
        name = name or type(m).__name__
        log.saw(name, path)
        if not matches(pattern, name, path):
            return next_fun(*args, **kwargs)
        log.placed.add(path)
        dyn, rebuild = _split_static(args, kwargs)

        def body(mdl, *values):
            a, k = rebuild(values)
            token = _INSIDE.set(True)   # the module's own call (re-intercepted) and its children pass through
            try:
                return mdl(*a, **k)
            finally:
                _INSIDE.reset(token)

        return nn.checkpoint(body, policy=policy, prevent_cse=True)(m, *dyn)

    with nn.intercept_methods(interceptor):
        yield


# a custom step's module calls that jaxmem may checkpoint besides linen's: (compiled --remat-at pattern, policy,
# CallLog) while its step is traced (custom_calls), read by jaxmem.program.equinox's wrapped module calls
CUSTOM: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("jaxmem_custom_calls", default=None)


@contextlib.contextmanager
def custom_calls(remat_at: str, policy, log: CallLog):
    """While a custom step is traced: its linen module calls as linen_calls checkpoints them, and the
    pattern, policy and log published (CUSTOM) for the module calls jaxmem.program.equinox wraps."""
    pattern = patterns.compile_pattern(remat_at, "--remat-at")
    token = CUSTOM.set((pattern, policy, log))
    try:
        with linen_calls(remat_at, policy, log):
            yield
    finally:
        CUSTOM.reset(token)


def _lifted_base(cls) -> str | None:
    """The module class a linen lifted transform made this one of (nn.scan(Layer) is a class
    ScanLayer subclassing Layer), None for a module class of the model's own."""

    base = cls.__mro__[1] if len(cls.__mro__) > 1 else None
    if base is None or base is nn.Module or not issubclass(base, nn.Module):
        return None
    prefix = cls.__name__[:-len(base.__name__)] if cls.__name__.endswith(base.__name__) else ""
    return base.__name__ if prefix[:1].isupper() and prefix.replace("_", "").isalpha() else None


def _scope_count() -> int | None:
    """Named scopes open now (the model's and jaxmem's), None where jax does not say."""
    try:
        return sum(type(e).__name__ == "Scope" for e in source_info_util.current_name_stack().stack)
    except Exception:  # noqa: BLE001 -- a jax without this private API: jaxmem's names go in unconditionally
        return None


@contextlib.contextmanager
def nnx_calls(model, *, remat_at: str | None, policy, log: CallLog, scopes: bool = True):
    """While active, each NNX module class in `model`'s graph has its ``__call__`` wrapped: a named
    scope of the module's path (`scopes`), and the checkpoint where `remat_at` finds it."""
    from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models

    pattern = patterns.compile_pattern(remat_at, "--remat-at") if remat_at is not None else None
    calls = _NnxCalls(nnx, model, pattern, policy, log, scopes)
    classes = {type(m) for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Module)}
    # every class's own __call__ resolved before any is wrapped: a subclass never wraps a wrapper
    originals = {cls: next((c.__dict__["__call__"] for c in cls.__mro__ if "__call__" in c.__dict__), None)
                 for cls in classes}
    had_own = {cls: "__call__" in cls.__dict__ for cls in classes}
    for cls, orig in originals.items():
        if orig is None:
            continue

        def wrapped(self, *a, __orig=orig, **k):
            return calls.call(self, __orig, a, k)

        cls.__call__ = wrapped  # type: ignore[method-assign]  # for this trace only: restored below
    jax.lax.scan = calls.scan
    try:
        yield
    finally:
        jax.lax.scan = calls.lax_scan
        for cls, orig in originals.items():
            if orig is None:
                continue
            if had_own[cls]:
                cls.__call__ = orig  # type: ignore[method-assign]
            else:
                del cls.__call__


class _NnxCalls:
    """One NNX model's module calls during a trace: each module's path (copies NNX transforms make
    included), its named scope, and the checkpoint where the --remat-at pattern finds it."""

    def __init__(self, nnx, model, pattern, policy, log: CallLog, scopes: bool):
        self.nnx, self.pattern, self.policy, self.log, self.scopes = nnx, pattern, policy, log, scopes
        self.paths: dict[int, tuple[str, ...]] = {}
        self.held: list = []   # the modules registered, kept alive: no id is reused by another module during the trace
        self.register(model, ())
        self.at = {self.paths[id(m)]: m for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Module)}
        self.root_name = type(model).__name__
        self.lax_scan = jax.lax.scan

    def register(self, root, prefix: tuple[str, ...]) -> None:
        for path, node in self.nnx.iter_graph(root):
            if isinstance(node, self.nnx.Module):
                self.paths[id(node)] = prefix + tuple(str(p) for p in path)
                self.held.append(node)

    def shapes(self, m) -> list[tuple[int, ...]]:
        return [tuple(np.shape(x)) for x in jax.tree.leaves(self.nnx.state(m))]

    def copied_from(self, module) -> tuple[str, ...] | None:
        """The path of the module an NNX transform copied `module` from: nnx.scan's body calls a copy of one
        layer of blocks nnx.vmap stacked, with the stacked axis taken off. The one module of its class
        under the caller's path whose variables have the copy's shapes (with the leading axis or
        without); None when that is not one module."""
        stack = _STACK.get()
        parent = stack[-1][0] if stack else ()
        found = [p for p, m in self.at.items()
                 if type(m) is type(module) and len(p) > len(parent) and p[:len(parent)] == parent]
        if len(found) > 1:
            mine = self.shapes(module)
            found = [p for p in found if len(theirs := self.shapes(self.at[p])) == len(mine)
                     and all(t == s or t[1:] == s for t, s in zip(theirs, mine, strict=True))]
        return found[0] if len(found) == 1 else None

    def call(self, module, orig, a, k):
        """A module's __call__: named by its path, checkpointed where the pattern matches it."""
        path = self.paths.get(id(module))
        cls_name = type(module).__name__
        if path is None:
            path = self.copied_from(module)
            if path is not None:   # named as its original is, and its submodules as theirs
                self.register(module, path)
        if path is None:
            # a copy an NNX transform made (nnx.scan's body, nnx.vmap): no path known, its class still
            if not _INSIDE.get() and matches(self.pattern, cls_name, ""):
                self.log.saw(cls_name, cls_name)
                self.log.placed.add(cls_name)
                return self.remat(module, orig, a, k, None)
            return orig(module, *a, **k)
        path_s = "/".join(path)
        self.log.saw(cls_name, path_s)
        stack = _STACK.get()
        scope, n = self.named_scope(stack, path)
        token = _STACK.set((*stack, (path, n)))
        try:
            with scope:
                if not _INSIDE.get() and matches(self.pattern, cls_name, path_s):
                    self.log.placed.add(path_s or self.root_name)
                    return self.remat(module, orig, a, k, path)
                return orig(module, *a, **k)
        finally:
            _STACK.reset(token)

    def named_scope(self, stack, path: tuple[str, ...]):
        """(the named scope a module at `path` is called in, the scope count inside it): its path below
        the caller's, unless the model named a scope of its own in between."""
        n = _scope_count()
        scope: contextlib.AbstractContextManager = contextlib.nullcontext()
        if self.scopes:
            name: str | None
            if not stack:
                name = self.root_name
            else:
                parent, parent_n = stack[-1]
                named_by_model = n is not None and parent_n is not None and n > parent_n
                rel = path[len(parent):] if path[:len(parent)] == parent else path
                name = None if named_by_model or not rel else "/".join(rel)
            if name is not None:
                scope = jax.named_scope(name)
                n = None if n is None else n + 1
        return scope, n

    def remat(self, module, orig, a, k, path):
        nnx = self.nnx
        keep = lambda x: isinstance(x, (nnx.Module, nnx.Variable))  # noqa: E731  (graph nodes stay as given)
        dyn, rebuild = _split_static(a, k, keep)

        def body(mdl, *values):
            if path is not None:
                self.register(mdl, path)   # nnx.remat hands the call a copy of the module: same paths
            a2, k2 = rebuild(values)
            token = _INSIDE.set(True)
            try:
                return orig(mdl, *a2, **k2)
            finally:
                _INSIDE.reset(token)

        return nnx.remat(body, policy=self.policy, prevent_cse=True)(module, *dyn)

    def scan(self, *a, **k):
        """nnx.scan's jax.lax.scan, in the named scope of the module it scans (as linen's nn.scan runs in
        its module's): the loop's own buffers (the layers' stacked activations) get its path."""
        path = _scanned_module(self.paths, self.nnx) if self.scopes else None
        stack = _STACK.get()
        parent = stack[-1][0] if stack else ()
        if path is None or path[:len(parent)] != parent or len(path) == len(parent):
            return self.lax_scan(*a, **k)
        with jax.named_scope("/".join(path[len(parent):])):
            return self.lax_scan(*a, **k)


def _scanned_module(paths: dict[int, tuple[str, ...]], nnx) -> tuple[str, ...] | None:
    """The path of the module an nnx.scan that is calling jax.lax.scan now scans (None when the call is
    not nnx.scan's, or what it scans has no known path). NNX hands jax.lax.scan the modules' state
    only; the modules themselves are the arguments of the transform's call, which Flax makes through
    its graph-context wrapper (graphlib.update_context): read from that frame, the nearest one."""
    frame: types.FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        if frame.f_code.co_name == "update_context_manager_wrapper":
            args = frame.f_locals.get("args", ())
            found = [paths[id(a)] for a in args if isinstance(a, nnx.Module) and id(a) in paths]
            return found[0] if len(found) == 1 else None
        frame = frame.f_back
    return None


_UNBOUND = re.compile(r"unbound axis name: (\w+)")


def unbound_axis(e: BaseException) -> str | None:
    """The collective axis name an error says jit left unbound (None for any other error)."""
    m = _UNBOUND.search(str(e))
    return m.group(1) if m else None


def with_collective_axis(once, batch, mutable, groups: int, batch_axes: tuple[str, ...], log: CallLog):
    """``once(batch, mutable) -> (loss, new_mutable)``, as written; if the model names a collective
    axis jit does not bind, again per device group with that axis bound (module docstring). The
    groups' losses are averaged (the loss of the whole batch); their updated state (BatchNorm's
    running statistics, the same in every group once the collective averaged them) averaged too."""
    try:
        return once(batch, mutable)
    except NameError as e:
        m = _UNBOUND.search(str(e))
        if m is None:
            raise
        name = m.group(1)
    log.collective_axis = name
    groups = max(groups, 1) if batch_axes else 1   # one group per data-parallel device (one on a single device)
    spmd = None if not batch_axes else batch_axes if len(batch_axes) > 1 else batch_axes[0]
    grouped = jax.tree.map(lambda x: x.reshape((groups, x.shape[0] // groups) + x.shape[1:]), batch)
    losses, new = jax.vmap(lambda b: once(b, mutable), axis_name=name, spmd_axis_name=spmd)(grouped)

    merged = jax.tree.map(lambda x: x.mean(0).astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x[0], new)
    return losses.mean(), merged
