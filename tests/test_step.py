"""The built step is the program a competent user runs."""
import contextlib
import re

import pytest

from conftest import build_step
from jaxmem.compiler import compiled, targets
from jaxmem.program import layouts, sharding, step, train_state

LLAMA = __import__("pathlib").Path(__file__).resolve().parent.parent / "models" / "llama.py"
GLOBAL_BATCH = 16


def gathered_shapes(hlo: str) -> list[tuple[int, ...]]:
    """Result shapes of every floating-point all-gather (sync or async) in an optimized HLO module.

    Integer gathers are token ids for the embedding lookup of an embed-sharded
    table: a few KB, and the standard FSDP lookup.
    """
    shapes = []
    for line in hlo.splitlines():
        m = re.search(r"= (.*?) all-gather(?:-done)?\(", line)
        if m:
            shapes += [tuple(int(d) for d in dims.split(",") if d)
                       for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1)) if dtype[0] in "fb"]
    return shapes


def build_llama(layout, mesh_text):
    return build_step(LLAMA, mesh=mesh_text, layout=layout, model_args={"preset": "tiny", "batch_size": GLOBAL_BATCH})[1]


def compile_llama(layout, mesh_text):
    return compiled.lower_and_compile(build_llama(layout, mesh_text))


def test_fsdp_gathers_weights_not_activations(monkeypatch):
    c, stats = compile_llama("fsdp", "data=8")
    shapes = gathered_shapes(c.as_text())
    assert shapes, "FSDP must all-gather weights"
    # an all-gathered activation has the global batch as its leading dim
    assert not [s for s in shapes if s and s[0] == GLOBAL_BATCH], shapes

    # Without jaxmem's batch-sharding constraints (its module-output interceptor and the
    # logical-axis rules for the model's own constraints) XLA gathers whole-batch
    # activations instead (docs/how-it-works.md §4): the test proves the constraints prevent it.
    monkeypatch.setattr(sharding, "activation_constraints", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(sharding, "activation_rules", lambda *a, **k: ())
    c2, stats2 = compile_llama("fsdp", "data=8")
    assert [s for s in gathered_shapes(c2.as_text()) if s and s[0] == GLOBAL_BATCH]
    assert stats2.temp > 2 * stats.temp


def test_the_interceptor_alone_keeps_activations_sharded(monkeypatch):
    # models without logical constraints of their own rely on jaxmem's module-output interceptor
    monkeypatch.setattr(sharding, "activation_rules", lambda *a, **k: ())
    c, _ = compile_llama("fsdp", "data=8")
    assert not [s for s in gathered_shapes(c.as_text()) if s and s[0] == GLOBAL_BATCH]


def test_fsdp_gathers_one_layer_at_a_time_inside_the_scanned_layer_loop():
    built = build_llama("fsdp", "data=8")
    c, _ = compiled.lower_and_compile(built)
    hlo = c.as_text()
    # dims compared sorted: XLA may gather a weight transposed
    dims = lambda shape: tuple(sorted(shape))  # noqa: E731
    stacked = {leaf.shape for leaf in built.leaves
               if leaf.category == "params" and leaf.path.split(":", 1)[1].startswith("layers/")}
    assert stacked and all(shape[0] == 2 for shape in stacked)  # the tiny preset's 2 scanned layers
    one_layer = {dims(shape[1:]) for shape in stacked}
    body = "\n".join(l for l in hlo.splitlines() if "all-gather" in l and "while/body" in l)
    gathered = {dims(shape) for shape in gathered_shapes(body)}
    assert gathered, "FSDP must gather weights inside the layer loop"
    # every weight gathered in the loop is ONE layer's slice of a stacked (n_layers, ...) weight
    assert gathered <= one_layer, gathered - one_layer
    assert not gathered & {dims(shape) for shape in stacked}


@pytest.mark.parametrize("layout,mesh", [("tp", "data=2,model=4"), ("fsdp_tp", "data=2,model=4"), ("dp", "data=8")])
def test_other_layouts_compile_and_keep_the_state_exact(layout, mesh):
    built = build_llama(layout, mesh)
    c, stats = compiled.lower_and_compile(built)
    state = train_state.summarize(built.leaves)
    # XLA's argument bytes are the analytic per-device bytes of every leaf under its sharding
    assert stats.argument == state.arguments
    params = [leaf for leaf in built.leaves if leaf.category == "params"]
    if layout == "dp":
        assert all(leaf.shards == 1 for leaf in params)
    else:  # the model axis splits some weights 4 ways
        assert any(leaf.shards % 4 == 0 for leaf in params)
    assert stats.temp > 0


def test_nnx_logical_names_reach_the_tp_layout():
    # an NNX Variable's out_sharding names sit above its /value in the path: the tp rule must see them
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxmem.program.workload import Workload

    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"))
    wl = Workload(model=lambda rngs: nnx.Linear(256, 128, kernel_init=init, rngs=rngs),
                  batch={"x": jax.ShapeDtypeStruct((8, 256), jnp.float32)}, loss=lambda m, b: m(b["x"]).mean())
    ms = layouts.parse_mesh("data=1,model=2")
    built = step.build(step.plan(wl, step.StepOptions(layout="tp"), ms), layouts.build_mesh(targets.make_target("h100", 2).devices, ms))
    kernel = next(leaf for leaf in built.leaves if leaf.path == "params:kernel/value")
    # 'mlp' (dim 1, 128) over the model axis; the unannotated fallback would split the larger dim 0
    assert kernel.spec == (None, "model")
