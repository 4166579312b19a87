"""What is analyzed: the model, its global batch, the loss and the optimizer.

A model file defines ``workload()`` returning a :class:`Workload`. Two forms:

* the usual one: ``Workload(model=..., batch=..., loss=..., optimizer=...)``; jaxmem
  builds the training step itself (forward, loss, backward, optax update, donated state);
* the escape hatch: ``Workload(step=..., state=..., batch=...)`` for any JAX training
  code: ``step(state, batch) -> (new_state, anything)`` and the abstract train state.

``workload()`` may accept keyword arguments; jaxmem passes the ones it names:
``remat`` (a policy name, see :data:`REMAT_POLICIES`) so that the model can place
checkpoints per layer, where they belong.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxmem.errors import UserError, clip, describe
from jaxmem.program import patterns, sizes
from jaxmem.program.options import (  # noqa: F401  (public here too)
    CHECKPOINT_DTYPES,
    REMAT_POLICIES,
    StepChoice,
    offloaded_names,
    remat_problem,
)
from jaxmem.report import ReportWarning


def remat_policy(name: str, save: tuple[str, ...] | list[str] = ()):
    """The ``jax.checkpoint`` policy for a ``--remat`` name: every name in REMAT_POLICIES, or
    ``offload:NAME[,NAME]``.

    Models use it as ``nn.remat(Block, policy=jaxmem.remat_policy(remat))``. ``full`` saves
    nothing (everything is recomputed); ``none`` saves everything, so a layer wrapped at the
    default ``--remat none`` recomputes nothing. nn.remat's ``prevent_cse=True`` barriers still
    change XLA:GPU's schedule, so models skip nn.remat at ``none`` (docs/model-files.md, "Remat").
    ``offload_dots`` is ``jax.checkpoint_policies.offload_dot_with_no_batch_dims`` and
    ``offload:NAME,...`` is ``save_and_offload_only_these_names`` (the activations named with
    ``checkpoint_name``): what they save lives in pinned host memory until the backward pass.
    `save`: checkpoint names kept on the device on top of the policy (MaxText's named policies).
    """
    import jax  # noqa: PLC0415 - jax-free at import: `import jaxmem` loads this module

    problem = remat_problem(name)
    if problem:
        raise ValueError(problem)
    cp = jax.checkpoint_policies
    if name == "full":
        policy = cp.nothing_saveable
    elif name == "none":
        policy = cp.everything_saveable
    elif name == "offload_dots":
        policy = cp.offload_dot_with_no_batch_dims("device", "pinned_host")
    elif offloaded_names(name):
        policy = cp.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=list(offloaded_names(name)),
            offload_src="device", offload_dst="pinned_host")
    else:
        policy = getattr(cp, name)
    if not save:
        return policy
    on_device = cp.save_only_these_names(*save)

    def policy_and_save(prim, *args, **params):
        # a named activation saved on the device wins; else the policy decides (it may offload)
        return True if on_device(prim, *args, **params) else policy(prim, *args, **params)

    return policy_and_save


@dataclasses.dataclass(frozen=True)
class Workload:
    """A training workload to analyze. All shapes are *global* (before sharding).

    model: a Flax linen ``nn.Module``; a Flax NNX ``nnx.Module``; or a function
        ``rngs -> nnx.Module`` (preferred for large NNX models: jaxmem calls it
        under ``nnx.eval_shape`` so no parameter is ever allocated).
    batch: pytree of ``jax.ShapeDtypeStruct`` (or arrays); leading dim = global batch.
    loss: ``loss(model, batch) -> scalar``. ``model`` is callable as in training
        code: an NNX module as it is, a linen module bound to its variables.
    optimizer: an optax ``GradientTransformation``; default AdamW(lr=1e-3).
    axis_rules: extra ``(logical_name, mesh_axis)`` rules for the ``tp`` layouts,
        tried before jaxmem's defaults.
    step / state: the escape hatch (see module docstring). ``donate=False`` says
        that your step does not donate its state (jaxmem then reports the cost).
    state_specs / batch_specs: with ``step``, your own shardings: pytrees of
        ``jax.sharding.PartitionSpec`` (None: replicated) matching ``state`` / ``batch``, in the
        axis names of ``--mesh``, used as written (the report's layout is ``user``).
    axis_types: ``"explicit"`` when the code is written for JAX's explicit sharding (``out_sharding=``,
        ``jax.sharding.reshard``): the mesh's axes are then Explicit, as ``--axis-types explicit`` makes
        them. None: as ``--axis-types`` says (default auto).
    remat_at: a regular expression of the linen/NNX modules (class name or module path, ``re.search``)
        whose calls jaxmem checkpoints with the ``--remat`` policy (``--remat-at`` sets it for a model
        file whose ``workload()`` takes no ``remat``): jaxmem.program.calls.
    checkpoint_dtype: the dtype the weights you fine-tune from are stored in (``"bfloat16"``, ``"float16"``,
        ``"float32"``; a Hugging Face config's ``torch_dtype``): under ``--lora`` the frozen base is kept in it
        where the step computes in bf16, as a fine-tuner loads it (``--base-dtype`` overrides). None: the
        dtype the model creates its parameters in.
    fp8_exclude: under ``--precision fp8``, a regular expression of module paths (``re.search``, as
        qwix prints them: ``lm_head``, ``layers/attn/q``) whose matmuls stay in the compute dtype, as
        MaxText and Transformer Engine recipes keep the output head. None: every weight matmul in FP8.
    """

    model: Any = None
    batch: Any = None
    loss: Callable[..., Any] | None = None
    optimizer: Any = None
    name: str | None = None
    axis_rules: tuple[tuple[str, str | None], ...] = ()
    rng_collections: tuple[str, ...] = ("dropout",)
    step: Callable[..., Any] | None = None
    state: Any = None
    donate: bool = True
    state_specs: Any = None
    batch_specs: Any = None
    axis_types: str | None = None
    fp8_exclude: str | None = None
    remat_at: str | None = None
    checkpoint_dtype: str | None = None
    remat_hook: bool = False   # set by jaxmem: workload() took `remat` (the model places its checkpoints)
    remat_at_unapplied: str | None = None   # set by jaxmem: a --remat-at the remat hook overrides (still checked)

    @property
    def is_custom_step(self) -> bool:
        return self.step is not None

    def validate(self, source: str) -> None:
        if self.axis_types not in (None, "auto", "explicit"):
            raise UserError(f"{source}: Workload(axis_types={self.axis_types!r}): give 'explicit' (or 'auto', or "
                            "leave it out)")
        if self.checkpoint_dtype not in (None, *CHECKPOINT_DTYPES):
            raise UserError(f"{source}: Workload(checkpoint_dtype={clip(repr(self.checkpoint_dtype))}): give one of "
                            f"{', '.join(map(repr, CHECKPOINT_DTYPES))} (the dtype the checkpoint stores), or leave "
                            "it out")
        for field in ("fp8_exclude", "remat_at", "remat_at_unapplied"):
            value = getattr(self, field)
            if value is None:
                continue
            flag = "Workload(fp8_exclude=...)" if field == "fp8_exclude" else "--remat-at"
            label = f"Workload(fp8_exclude={clip(repr(value))})" if field == "fp8_exclude" else None
            try:   # matched by RE2 (linear time): a pattern it cannot express is refused here, before any trace
                patterns.compile_pattern(value, flag, label)
            except UserError as e:
                raise UserError(f"{source}: {e}") from None
        if self.batch is None:
            raise UserError(f"{source}: Workload has no `batch`; give the global batch as a pytree of "
                            "jax.ShapeDtypeStruct.")
        if self.is_custom_step:
            if self.state is None:
                raise UserError(f"{source}: a Workload with `step=` also needs `state=` (the abstract train state).")
            return
        if self.model is None:
            raise UserError(f"{source}: Workload has neither `model=` nor `step=`.")
        if is_equinox_module(self.model):
            raise UserError(f"{source}: Workload(model=...) is an equinox.Module ({type(self.model).__name__}); "
                            f"model= takes Flax modules. {EQUINOX_RECIPE}")
        wrapped = wrapped_linen_module(self.model)
        if wrapped is not None:
            raise UserError(f"{source}: Workload(model=...) is a {type(self.model).__name__}, a library's wrapper "
                            f"around the Flax linen module {type(wrapped).__name__}; give that module: "
                            "Workload(model=<the model>.module, ...) (Hugging Face: build the model with "
                            "_do_init=False so no weights are allocated).")
        if self.loss is None:
            raise UserError(f"{source}: Workload has no `loss`; give loss(model, batch) -> scalar.")

    def _check_arrays(self, source: str) -> None:
        import jax  # noqa: PLC0415 - jax-free at import: `import jaxmem` loads this module

        trees = [("batch", self.batch)] + ([("state", self.state)] if self.is_custom_step else [])
        for name, tree in trees:
            flat, _ = jax.tree_util.tree_flatten_with_path(tree)
            if not flat:
                raise UserError(f"{source}: Workload `{name}` has no arrays; give a pytree of jax.ShapeDtypeStruct.")
            for path, leaf in flat:
                shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
                where = f"{name}{jax.tree_util.keystr(path)}"
                if shape is None or dtype is None:
                    raise UserError(f"{source}: {where} is a {type(leaf).__name__} ({leaf!r:.40}), not an array; every "
                                    f"leaf of `{name}` must be a jax.ShapeDtypeStruct (or an array).")
                if any(not isinstance(d, int) or d < 0 for d in shape):
                    raise UserError(f"{source}: {where} has shape {tuple(shape)}; dimensions must be non-negative "
                                    "integers.")

    def checked(self, source: str) -> Workload:
        """This workload with the user's callables checked where they return: the loss must give a
        scalar, a custom step `(new_state, anything)` (errors that name the culprit, not jax's)."""
        if getattr(self.loss, "_jaxmem_checked", False) or getattr(self.step, "_jaxmem_checked", False):
            return self
        self._check_arrays(source)
        if self.is_custom_step:
            step = self.step
            assert step is not None   # is_custom_step

            def checked_step(state, batch):
                out = step(state, batch)
                if not (isinstance(out, (tuple, list)) and len(out) == 2):
                    got = (f"an array of shape {tuple(out.shape)}" if hasattr(out, "shape")
                           else f"a {type(out).__name__}")
                    raise UserError(f"{source}: step(state, batch) returned {got}; it must return "
                                    "(new_state, anything), e.g. `return new_state, loss`.")
                return out

            checked_step.__dict__["_jaxmem_checked"] = True
            return dataclasses.replace(self, step=checked_step)
        loss = self.loss
        assert loss is not None   # validated: a workload without its own step has a loss

        def checked_loss(*args, **kwargs):
            out = loss(*args, **kwargs)
            if isinstance(out, (tuple, list, dict)):
                raise UserError(f"{source}: loss(model, batch) returned a {type(out).__name__}; it must return the "
                                "scalar loss. If yours returns (loss, aux), give jaxmem "
                                "`loss=lambda model, batch: your_loss(model, batch)[0]`.")
            shape = getattr(out, "shape", ())
            if tuple(shape) != ():
                raise UserError(f"{source}: loss(model, batch) returned an array of shape {tuple(shape)}; it must "
                                "return a scalar: reduce it over the batch (e.g. `.mean()`).")
            return out

        checked_loss.__dict__["_jaxmem_checked"] = True
        return dataclasses.replace(self, loss=checked_loss)


EQUINOX_RECIPE = (
    "An Equinox model goes through jaxmem.equinox_workload(model, loss, optimizer, batch), which builds its training "
    "step: `def workload(): model = eqx.filter_eval_shape(MyModel, key=jax.random.key(0)); return "
    "jaxmem.equinox_workload(model, loss_fn, optax.adamw(3e-4), batch)`, loss_fn(model, batch) -> scalar "
    "(docs/model-files.md, \"Equinox and plain JAX\")")


def is_equinox_module(obj: Any) -> bool:
    """`obj` is an equinox.Module (told by its classes: equinox is not imported for it)."""
    return any(c.__module__.split(".")[0] == "equinox" and c.__name__ == "Module" for c in type(obj).__mro__)


def _flax_classes(obj: Any) -> set[str]:
    return {f"{c.__module__}.{c.__name__}" for c in type(obj).__mro__ if c.__module__.startswith("flax.")}


def wrapped_linen_module(model: Any) -> Any:
    """The linen module a library's model object wraps (Hugging Face's FlaxPreTrainedModel keeps it as
    `.module`), or None: told by duck typing, so no library is imported. A Flax module itself (an NNX
    bridge's ToNNX also has a `.module`) is never a wrapper."""
    if _flax_classes(model):
        return None
    try:
        inner = getattr(model, "module", None)
    except Exception:  # noqa: BLE001 -- a user object's property can raise anything: then it is no wrapper
        return None
    return inner if "flax.linen.module.Module" in _flax_classes(inner) else None


class _ModelCalledOsExit(BaseException):
    """Raised in place of os._exit while a model file's code runs (not an Exception: a model's
    `except Exception` cannot swallow it)."""

    def __init__(self, status):
        super().__init__(status)
        self.status = status


_guard = {"depth": 0}


@contextlib.contextmanager
def running_user_code(source: str | Path):
    """While a model file's code runs (its import, ``workload()``, tracing its model and loss):

    * its stdout goes to stderr (Python's and file descriptor 1), so ``--json`` stays clean;
    * its own ``sys.exit``/``SystemExit``, ``os._exit`` or ``KeyboardInterrupt`` (one no signal
      sent) is a UserError that says so -- never jaxmem's exit 0 ("fits") or 3 ("does not fit").

    Re-entrant: only the outermost use redirects and patches.
    """
    if _guard["depth"]:
        _guard["depth"] += 1
        try:
            yield
        finally:
            _guard["depth"] -= 1
        return
    path = Path(source)
    owner, real_os_exit = os.getpid(), os._exit

    def refuse_os_exit(status=0):
        if os.getpid() != owner:  # a child the model forked exits as it means to
            real_os_exit(status)
        raise _ModelCalledOsExit(status)

    with contextlib.ExitStack() as stack:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        saved_fd1 = None
        try:
            saved_fd1 = os.dup(1)
            os.dup2(2, 1)
        except OSError:  # no fd 1 or 2 (embedded use): Python's stdout is still redirected
            saved_fd1 = None
        if saved_fd1 is not None:
            stack.callback(os.close, saved_fd1)
            stack.callback(os.dup2, saved_fd1, 1)
        stack.enter_context(contextlib.redirect_stdout(sys.stderr))
        os._exit = refuse_os_exit
        stack.callback(setattr, os, "_exit", real_os_exit)
        _guard["depth"] += 1
        stack.callback(_guard.__setitem__, "depth", 0)
        try:
            yield
        except SystemExit as e:
            raise UserError(f"{path}: the model file called sys.exit({e.code!r}){_where(e, path)}; jaxmem stopped "
                            "without a verdict. A model file must not exit: remove the call, or put it under "
                            "`if __name__ == \"__main__\":`.") from None
        except _ModelCalledOsExit as e:
            raise UserError(f"{path}: the model file called os._exit({e.status!r}){_where(e, path)}; jaxmem stopped "
                            "without a verdict. A model file must not exit: remove the call, or put it under "
                            "`if __name__ == \"__main__\":`.") from None
        except KeyboardInterrupt as e:
            from jaxmem import scratch  # noqa: PLC0415 - its signal machinery: not at `import jaxmem`

            if scratch.interrupted_by_signal():
                raise
            raise UserError(f"{path}: the model file raised KeyboardInterrupt{_where(e, path)} (no signal was "
                            "sent); jaxmem stopped without a verdict.") from None
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()


def _where(e: BaseException, path: Path) -> str:
    """` (file.py, line N)` for the deepest frame of the exception in the user's file, else ``""``."""
    where = ""
    with contextlib.suppress(OSError):
        target = path.resolve()
        for frame in traceback.extract_tb(e.__traceback__):
            if Path(frame.filename).resolve() == target:
                where = f" ({path.name}, line {frame.lineno})"
    return where


def load_workload(path: str | Path, *, remat: str = "none", remat_at: str | None = None, **model_args: Any) -> Workload:
    """Import a model file and call its ``workload(**model_args)``.

    Errors in the user's file become one UserError that quotes the user's own
    frame, not ours. The model's code runs under :func:`running_user_code`.
    """
    if remat_at is not None:   # before the model file runs: applied or not, it must be a pattern jaxmem matches
        patterns.compile_pattern(remat_at, "--remat-at")
    with running_user_code(path):
        return _load_workload(Path(path), remat, model_args, remat_at)


def source_label(model: Workload | Callable[..., Workload]) -> str:
    """What a report's `source` and the errors call a model given in Python (a file's is its path)."""
    if isinstance(model, Workload):
        return "<workload>"
    return f"{getattr(model, '__qualname__', type(model).__name__)}()"


def workload_of(model: Workload | Callable[..., Workload], *, remat: str = "none",
                model_args: dict[str, Any] | None = None, remat_at: str | None = None) -> tuple[Workload, str]:
    """The workload of a model given in Python (the API's `jaxmem.analyze(workload_fn)`), and the
    source label its report and errors name: a Workload as it is, or a function called as a model
    file's ``workload()`` is (model arguments, ``remat``)."""
    model_args = dict(model_args or {})
    source = source_label(model)
    if remat_at is not None:
        patterns.compile_pattern(remat_at, "--remat-at")
    if isinstance(model, Workload):
        if model_args:
            raise UserError(f"{source}: args={model_args} are arguments of a workload() function, but a Workload "
                            "object was given; pass the function that builds it (jaxmem calls it with them).")
        if remat_at is not None:
            model = dataclasses.replace(model, remat_at=remat_at)
        if remat != "none" and model.remat_at is None and model.is_custom_step:
            raise UserError(f"{source}: remat={remat!r} asked, but this Workload gives its own `step`, so jaxmem "
                            "cannot place checkpoints inside it. Name the linen (or jaxmem.equinox_workload) modules "
                            "to checkpoint (remat_at='Block'), or pass a function workload(remat=...) whose step wraps "
                            "its layers in jax.checkpoint(layer, policy=jaxmem.remat_policy(remat)).")
        if remat != "none" and model.remat_at is None:
            raise UserError(f"{source}: remat={remat!r} asked, but a Workload object was given, so jaxmem cannot "
                            "place checkpoints inside your model. Name the modules to checkpoint (remat_at='Block'), "
                            "or pass a function workload(remat=...) that wraps its layers with "
                            "nn.remat(Layer, policy=jaxmem.remat_policy(remat)).")
        model.validate(source)
        return model, source
    if not callable(model):
        raise UserError(f"model={model!r:.80}: expected a model file's path, a jaxmem.Workload, or a function "
                        "returning one")
    with running_user_code(source):
        wl = call_workload(model, Path(source), remat, model_args, remat_at)
    if wl.name is None:
        wl = dataclasses.replace(wl, name=getattr(model, "__name__", None))
    return wl, source


def _load_workload(path: Path, remat: str, model_args: dict[str, Any], remat_at: str | None = None) -> Workload:
    from jaxmem import hf  # noqa: PLC0415 - the config.json decoder imports jax; this module is jax-free

    config = hf.config_file(path)
    if config is not None:   # a Hugging Face config.json: jaxmem's Flax decoder is its workload() (jaxmem/hf)
        return call_workload(hf.workload_function(config), config, remat, model_args, remat_at)
    if path.is_dir():
        raise UserError(f"{path} is a directory; give the model file (a .py defining workload()), or a folder "
                        "holding a Hugging Face config.json.")
    if path.exists() and not path.is_file():
        raise UserError(f"{path} is not a regular file; give the model file (a .py defining workload()).")
    if not path.is_file():
        raise UserError(f"model file not found: {path}")
    module_name = f"jaxmem_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"{path}: not a Python file that can be imported (a model file ends in .py)")
    module = importlib.util.module_from_spec(spec)
    # Model files may import siblings (e.g. a shared layers.py).
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 -- the user's file failed to import, however: say where
        raise UserError(f"{path}: failed to import: {_user_frame(e, path)}{_shadow_hint(e)}") from None
    finally:
        sys.path.pop(0)
    fn = getattr(module, "workload", None)
    if not callable(fn):
        raise UserError(f"{path}: defines no `workload()` function. Add `def workload(): return "
                        "jaxmem.Workload(model=..., batch=..., loss=...)`.")
    wl = call_workload(fn, path, remat, model_args, remat_at)
    if wl.name is None:
        wl = dataclasses.replace(wl, name=path.stem)
    return wl


def call_workload(fn: Callable[..., Any], path: Path, remat: str, model_args: dict[str, Any],
                  remat_at: str | None = None) -> Workload:
    """Call a ``workload()`` function as jaxmem does a model file's: the model arguments checked
    against its signature, ``remat`` passed when it takes it, its errors quoting the frame in
    ``path`` (the model file, or a label for a function given to the Python API)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or a C callable: nothing to check its arguments against
        raise UserError(f"{path}: cannot read the signature of {fn!r}; give a Python function that returns "
                        "a jaxmem.Workload") from None
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [k for k in model_args if k not in params and not accepts_any]
    if unknown:
        takes = ", ".join(p for p in params) or "no arguments"
        raise UserError(f"{path}: workload() has no argument {unknown[0]!r} (--arg); it takes: {takes}")
    _check_arg_types(path, params, model_args)
    _check_shape_args(path, model_args)
    kwargs = dict(model_args)
    # the model places its own checkpoints (it wins over --remat-at): it names `remat`, or takes any
    # keyword and is asked for a policy with nowhere else to put it (at none, such a function is not told)
    hook = "remat" in params or (accepts_any and remat != "none" and remat_at is None)
    if hook:
        kwargs["remat"] = remat
    try:
        wl = fn(**kwargs)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 -- the user's workload() can raise anything: quoted
        raise UserError(f"{path}: workload() raised: {_user_frame(e, path)}{_arg_hint(e, model_args)}"
                        f"{_shadow_hint(e)}") from None
    if not isinstance(wl, Workload):
        raise UserError(f"{path}: workload() returned {type(wl).__name__}, expected jaxmem.Workload")
    if hook:   # --remat-at is not applied, but checked all the same (Workload.validate, CallLog.check)
        wl = dataclasses.replace(wl, remat_hook=True, remat_at_unapplied=remat_at)
    elif remat_at is not None:
        wl = dataclasses.replace(wl, remat_at=remat_at)
    if not hook and remat != "none" and wl.remat_at is None and wl.is_custom_step:
        raise UserError(
            f"{path}: --remat {remat} asked, but this workload gives its own `step`, and `workload()` takes no "
            "`remat` argument, so jaxmem has nowhere to put checkpoints. Write the hook: take `remat` in "
            "workload(remat='none') and wrap the layers your step calls in jax.checkpoint(layer, "
            "policy=jaxmem.remat_policy(remat)); or name the linen (or jaxmem.equinox_workload) modules to "
            "checkpoint with --remat-at."
        )
    if not hook and remat != "none" and wl.remat_at is None:
        raise UserError(
            f"{path}: --remat {remat} asked, but `workload()` takes no `remat` argument, so jaxmem does not know "
            "where checkpoints belong. Name the modules to checkpoint with --remat-at (a class name such as Block, "
            "or a module path), or add a `remat` parameter and wrap your layers with "
            "nn.remat(Layer, policy=jaxmem.remat_policy(remat)) (see models/llama.py)."
        )
    wl.validate(str(path))
    return wl


# The workload arguments that are a dimension of the batch in every shipped model and in a config.json's
SHAPE_ARGS = ("batch_size", "seq_len")


def _check_shape_args(path: Path, model_args: dict[str, Any]) -> None:
    """--arg seq_len=0 (or batch_size, negative, past int32): refused as a config.json's is, never taken for
    'not given' (a model file's `seq_len or cfg.seq_len` would answer for the preset's length)."""
    for key in SHAPE_ARGS:
        value = model_args.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= sizes.INT32_MAX:
            raise UserError(f"{path}: --arg {key}={value} must be at least 1 and at most {sizes.INT32_MAX:,} "
                            "(int32, the largest dimension XLA can shape)")


def _check_arg_types(path: Path, params, model_args: dict[str, Any]) -> None:
    """`--arg hidden=abc` where workload(hidden: int = 128): the user's typo, named as theirs.

    The expected type is the parameter's annotation when it is a plain int/float/bool/str,
    else the type of its default.
    """
    names = {"int": int, "float": float, "bool": bool, "str": str}
    for key, value in model_args.items():
        p = params.get(key)
        if p is None:
            continue
        want = p.annotation if p.annotation in (int, float, bool, str) else names.get(p.annotation) \
            if isinstance(p.annotation, str) else None
        if want is None and p.default is not p.empty and type(p.default) in (int, float, bool):
            want = type(p.default)
        if want is None or value is None:
            continue
        ok = (isinstance(value, want) and not (want is int and isinstance(value, bool))) or \
            (want is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            shown = f" (default {p.default!r})" if p.default is not p.empty else ""
            raise UserError(f"--arg {key}={value}: workload() expects {key} to be {want.__name__}{shown}, "
                            f"got {type(value).__name__} {value!r}. Give e.g. --arg {key}="
                            f"{_example(want, p.default)}.")


def _example(want: type, default: Any) -> str:
    if default is not inspect.Parameter.empty and isinstance(default, want):
        return str(default).lower() if want is bool else str(default)
    return {int: "8", float: "0.5", bool: "true", str: "name"}[want]


def _shadow_hint(e: BaseException) -> str:
    """A folder named jaxmem on sys.path (a clone's, seen from the folder that holds it) imported as
    a namespace package in place of jaxmem: say so rather than leave `no attribute 'Workload'`."""
    if isinstance(e, (AttributeError, ImportError)) and "jaxmem" in str(e):
        mod = sys.modules.get("jaxmem")
        if mod is not None and getattr(mod, "__file__", None) is None:
            where = ", ".join(getattr(mod, "__path__", [])) or "a folder on sys.path"
            return (f" [note: `import jaxmem` found the folder {where}, not the installed package: run from another "
                    "directory, or remove that folder from sys.path]")
    return ""


def _arg_hint(e: Exception, model_args: dict[str, Any]) -> str:
    """When workload() fails on a --arg value that stayed a string, say it was one."""
    strings = [f"--arg {k}={v}" for k, v in model_args.items() if isinstance(v, str)]
    if strings and isinstance(e, (TypeError, ValueError, KeyError)):
        return f" [note: {', '.join(strings)} reached workload() as a string]"
    return ""


def _user_frame(e: BaseException, path: Path) -> str:
    """`ExcType: message (file.py, line N)` for the deepest frame in the user's file: the message
    whole (errors.describe), the location after its first line."""
    where = _where(e, path)
    if isinstance(e, SyntaxError):  # str() already ends in "(file, line N)": say it once
        if e.lineno:
            where = f" ({path.name}, line {e.lineno})"
        return f"{type(e).__name__}: {(e.msg or '').strip()}{where}"
    first, sep, rest = describe(e).partition("\n")
    return f"{first}{where}{sep}{rest}"


def check_remat_at(wl: Workload, remat_at: str | None, remat: str) -> list[ReportWarning]:
    """remat_at_ignored: --remat-at on a model whose workload() places its own checkpoints."""
    if remat_at is None or not wl.remat_hook:
        return []
    return [ReportWarning(
        "remat_at_ignored", f"--remat-at {remat_at!r} is not applied: this model's workload() takes `remat` "
        f"and places its own checkpoints (--remat {remat} went there)")]
