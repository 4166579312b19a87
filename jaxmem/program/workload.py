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

import dataclasses
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from jaxmem.errors import UserError

# Names accepted by --remat. "none" and "full" are jaxmem's; the rest are
# jax.checkpoint_policies of the same name.
REMAT_POLICIES = (
    "none",
    "full",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "checkpoint_dots",
    "checkpoint_dots_with_no_batch_dims",
    "everything_saveable",
    "nothing_saveable",
)


def remat_policy(name: str):
    """The ``jax.checkpoint`` policy for a ``--remat`` name (``None`` saves nothing).

    Models use it as ``nn.remat(Block, policy=jaxmem.remat_policy(remat))``.
    """
    import jax

    if name not in REMAT_POLICIES or name == "none":
        raise ValueError(f"no checkpoint policy for remat={name!r}")
    if name == "full":
        return jax.checkpoint_policies.nothing_saveable
    return getattr(jax.checkpoint_policies, name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepChoice:
    """What defines the training step besides the model file: the same for `analyze`, which
    predicts it, and `verify`, which measures it (one definition, so they cannot drift)."""

    model_args: tuple[tuple[str, Any], ...] = ()   # keyword arguments for workload()
    mesh: str = "data=1"
    layout: str = "fsdp"
    precision: str = "fp32"
    optimizer: str | None = None
    batch: int | None = None
    accum: int = 1
    remat: str = "none"
    donate: bool = True

    def step_options(self):
        from jaxmem.program.step import StepOptions

        return StepOptions(self.layout, self.precision, self.optimizer, self.batch, self.accum, self.donate)


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

    @property
    def is_custom_step(self) -> bool:
        return self.step is not None

    def validate(self, source: str) -> None:
        if self.batch is None:
            raise UserError(f"{source}: Workload has no `batch`; give the global batch as a pytree of jax.ShapeDtypeStruct.")
        if self.is_custom_step:
            if self.state is None:
                raise UserError(f"{source}: a Workload with `step=` also needs `state=` (the abstract train state).")
            return
        if self.model is None:
            raise UserError(f"{source}: Workload has neither `model=` nor `step=`.")
        if self.loss is None:
            raise UserError(f"{source}: Workload has no `loss`; give loss(model, batch) -> scalar.")


def load_workload(path: str | Path, *, remat: str = "none", **model_args: Any) -> Workload:
    """Import a model file and call its ``workload(**model_args)``.

    Errors in the user's file become one UserError that quotes the user's own
    frame, not ours.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"model file not found: {path}")
    module_name = f"jaxmem_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"{path}: not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    # Model files may import siblings (e.g. a shared layers.py).
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file failed to import: say where
        raise UserError(f"{path}: failed to import: {_user_frame(e, path)}") from None
    finally:
        sys.path.pop(0)
    fn = getattr(module, "workload", None)
    if not callable(fn):
        raise UserError(f"{path}: defines no `workload()` function. Add `def workload(): return jaxmem.Workload(model=..., batch=..., loss=...)`.")
    params = inspect.signature(fn).parameters
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [k for k in model_args if k not in params and not accepts_any]
    if unknown:
        takes = ", ".join(p for p in params) or "no arguments"
        raise UserError(f"{path}: workload() has no argument {unknown[0]!r} (--arg); it takes: {takes}")
    kwargs = dict(model_args)
    if "remat" in params or accepts_any:
        kwargs["remat"] = remat
    elif remat != "none":
        raise UserError(
            f"{path}: --remat {remat} asked, but `workload()` takes no `remat` argument, so jaxmem cannot place "
            "checkpoints inside your model. Add a `remat` parameter and wrap your layers with "
            "nn.remat(Layer, policy=jaxmem.remat_policy(remat)) (see models/llama.py)."
        )
    try:
        wl = fn(**kwargs)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"{path}: workload() raised: {_user_frame(e, path)}") from None
    if not isinstance(wl, Workload):
        raise UserError(f"{path}: workload() returned {type(wl).__name__}, expected jaxmem.Workload")
    wl.validate(str(path))
    if wl.name is None:
        wl = dataclasses.replace(wl, name=path.stem)
    return wl


def _user_frame(e: BaseException, path: Path) -> str:
    """`ExcType: message (file.py, line N)` for the deepest frame in the user's file."""
    where = ""
    for frame in traceback.extract_tb(e.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            where = f" ({path.name}, line {frame.lineno})"
    if isinstance(e, SyntaxError) and e.lineno:
        where = f" ({path.name}, line {e.lineno})"
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}{where}"
