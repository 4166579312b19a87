"""Your own shardings (Workload state_specs / batch_specs, jaxmem/program/user_specs.py): used as
written, checked before any device exists, and the argument bytes are exactly what they imply."""

import math

import jax
import pytest
from click.testing import CliRunner
from conftest import MODELS

import jaxmem
from jaxmem import cli

FIX = MODELS.parent / "tests" / "fixtures"
SPECS = FIX / "custom_specs.py"
MESH = {"fsdp": 4, "tensor": 2}


def implied_bytes(wl) -> int:
    """Each leaf's global bytes over the product of the mesh axes its spec names."""
    from jax.sharding import PartitionSpec as P

    total = 0
    for tree, specs in ((wl.state, wl.state_specs), (wl.batch, wl.batch_specs)):
        flat_specs = jax.tree_util.tree_flatten(specs, is_leaf=lambda x: x is None or isinstance(x, P))[0]
        for x, spec in zip(jax.tree.leaves(tree), flat_specs, strict=True):
            names = [a for e in (spec or ()) if e is not None for a in ((e,) if isinstance(e, str) else e)]
            total += math.prod(x.shape) * x.dtype.itemsize // math.prod(MESH[a] for a in names)
    return total


def test_argument_bytes_equal_the_bytes_the_specs_imply():
    import importlib.util

    spec = importlib.util.spec_from_file_location("custom_specs", SPECS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    r = jaxmem.analyze(SPECS, gpu="h100", mesh="fsdp=4,tensor=2", explain=False)
    assert r.layout == "user"
    assert r.xla["argument"] == implied_bytes(module.workload())
    assert r.state_check["analytic_argument_bytes"] == r.xla["argument"]


@pytest.mark.parametrize("variant,message", [
    ("mismatch", "state_specs does not match `state`: no spec for the leaf state/params/b"),
    ("unknown_axis",
     r"state/opt_state/0/trace/w2 \(1024, 512\), dim 0: the mesh has no axis 'model' \(--mesh fsdp=4,tensor=2"),
    ("undivisible", r"state/opt_state/0/trace/w1 \(510, 1024\), dim 0 \(510\) is not divisible by fsdp=4"),
    ("twice", r"state/opt_state/0/trace/w1 \(512, 1024\): its spec P\('fsdp', 'fsdp'\) uses the axis fsdp twice"),
])
def test_a_spec_that_does_not_fit_exits_2_naming_the_leaf_and_dimension(variant, message, monkeypatch):
    import re

    from jaxmem.program import layouts

    # checked in step.plan: no device (no mesh) is ever built
    monkeypatch.setattr(layouts, "build_mesh", lambda *a: pytest.fail("a mesh was built"))
    r = CliRunner().invoke(cli.main, ["analyze", str(SPECS), "--arg", f"variant={variant}", "--gpu", "h100",
                                      "--mesh", "fsdp=4,tensor=2"])
    assert r.exit_code == 2 and re.search(message, r.output) and "Traceback" not in r.output, r.output


def test_specs_need_a_workloads_own_step():
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    wl = jaxmem.Workload(model=object(), loss=lambda m, b: 0.0, batch={"x": jax.ShapeDtypeStruct((8, 4), jnp.float32)},
                         batch_specs={"x": P("data")})
    with pytest.raises(jaxmem.UserError, match="state_specs/batch_specs go with step="):
        jaxmem.analyze(wl, gpu="h100", mesh="data=8")
