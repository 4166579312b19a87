"""jaxmem/program/calls.py: NNX module paths in XLA's metadata, and --remat-at checkpoints on models
without a remat hook (NNX in a Python loop, linen under nn.scan), placed where the report says."""

from __future__ import annotations

import pathlib
import re

import pytest
from click.testing import CliRunner

import jaxmem
from jaxmem import cli
from jaxmem.program import calls
from jaxmem.xla import opnames

NNX = "models/llama_nnx.py"   # shipped: NNX, Python-loop blocks, no named scopes, no remat hook
SCAN = "tests/fixtures/scan_noremat.py"


def _run(model, **kw):
    return jaxmem.analyze(model, gpu="h100", cache=False, **kw)


def _acts(r) -> int:
    return r.breakdown["activations_and_temporaries"]


@pytest.fixture(scope="module")
def nnx_plain():
    return _run(NNX)


def test_an_nnx_model_without_named_scopes_has_its_buffers_attributed_by_attribute_path(nnx_plain):
    rows = {m.module_path: m.bytes for m in nnx_plain.modules}
    assert {f"Llama/blocks/{i}" for i in range(4)} <= set(rows), rows
    # of what is not the train state, under 10% is outside every module
    live = {k: v for k, v in rows.items() if not k.startswith("[")}
    outside = sum(v for k, v in live.items() if k.startswith("(")) / sum(live.values())
    assert outside < 0.10, rows
    deep = jaxmem.analyze(NNX, gpu="h100", module_depth=5).modules
    assert any(m.module_path.startswith("Llama/blocks/3/attn") for m in deep), [m.module_path for m in deep]


def test_nnx_scan_over_vmapped_blocks_is_attributed_to_the_blocks_as_linens_scan_is():
    # blocks made by nnx.vmap, run by nnx.scan, no named scopes (Flax's docs' way): the scan body gets
    # copies of the layer; they and the loop's stacked activations are named for the module scanned
    r = _run("tests/fixtures/nnx_scan_vmap.py", mesh="data=2")
    rows = {m.module_path: m.bytes for m in r.modules}
    assert {"Net/blocks", "Net/blocks/attn", "Net/blocks/up", "Net/blocks/down"} <= set(rows), rows
    live = {k: v for k, v in rows.items() if not k.startswith("[")}
    outside = sum(v for k, v in live.items() if k.startswith("(")) / sum(live.values())
    assert outside < 0.10, rows
    assert all(b.module_path.startswith("Net") for b in r.top_buffers[:3]), r.top_buffers[:3]


def test_remat_at_the_block_of_an_nnx_model_without_a_hook_cuts_its_activations(nnx_plain):
    r = _run(NNX, remat="full", remat_at="Block")
    assert _acts(r) <= 0.6 * _acts(nnx_plain), (_acts(r), _acts(nnx_plain))
    assert r.options["remat_at"] == "Block"
    assert r.options["remat_placed"] == [f"blocks/{i}" for i in range(4)]   # the outermost match, not attn inside


def test_remat_at_checkpoints_each_iteration_of_scanned_linen_layers():
    plain, remat = _run(SCAN), _run(SCAN, remat="full", remat_at="^Layer$")
    assert _acts(remat) <= 0.6 * _acts(plain), (_acts(remat), _acts(plain))
    assert remat.options["remat_placed"] == ["layers"]
    # one module, one path: no ScanLayer/Layer wrapper names, no doubled layers/layers
    paths = [m.module_path for m in remat.modules]
    assert [p for p in paths if re.search(r"(Scan)?Layer(/|$)|layers/layers|\.body", p)] == [], paths


def test_a_remat_at_that_finds_no_module_is_exit_2_naming_the_modules_it_could():
    res = CliRunner().invoke(cli.main, ["analyze", SCAN, "--gpu", "h100", "--remat", "full", "--remat-at", "Nope",
                                        "--no-cache"])
    assert res.exit_code == 2, res.output
    assert "--remat-at 'Nope' finds no module" in res.output and "Layer (layers)" in res.output
    res = CliRunner().invoke(cli.main, ["analyze", SCAN, "--gpu", "h100", "--remat-at", "(", "--no-cache"])
    assert res.exit_code == 2 and "is not a valid regular expression" in res.output, res.output


def test_remat_without_a_hook_or_remat_at_is_refused_pointing_to_remat_at():
    res = CliRunner().invoke(cli.main, ["analyze", SCAN, "--gpu", "h100", "--remat", "full"])
    assert res.exit_code == 2 and "--remat-at" in res.output, res.output


def test_a_models_own_remat_hook_wins_over_remat_at_and_the_report_says_so():
    args = {"preset": "tiny"}
    hook = _run("models/llama.py", remat="full", args=args)
    both = _run("models/llama.py", remat="full", remat_at="DecoderLayer", args=args)   # found, not applied
    assert both.per_device_peak_bytes == hook.per_device_peak_bytes
    assert "remat_at" not in both.options
    assert [w.kind for w in both.warnings if w.kind == "remat_at_ignored"] == ["remat_at_ignored"]


def test_the_repeated_block_is_the_outermost_class_with_the_most_instances():
    log = calls.CallLog()
    for path, cls in [("", "Decoder"), ("embed", "Embed"), ("head", "Linear")] + [
            (f"blocks/{i}{sub}", c) for i in range(3) for sub, c in [("", "Block"), ("/attn", "Attention"),
                                                                    ("/attn/q", "Linear"), ("/up", "Linear")]]:
        log.saw(cls, path)
    # Linear has the most instances but holds no module; Attention ties with Block, deeper
    assert log.repeated_block() == "Block"
    scanned = calls.CallLog()
    for path, cls in [("", "Stack"), ("layers", "Layer"), ("layers/up", "Dense"), ("layers/down", "Dense")]:
        scanned.saw(cls, path)
    assert scanned.repeated_block() == "Layer"


def test_compare_remats_on_a_model_without_a_hook_checkpoints_its_repeated_block():
    from jaxmem.pipeline import AnalyzeOptions
    from jaxmem.plan import compare

    cells = compare.compare(SCAN, AnalyzeOptions(gpu="h100"), {"remat": "none,full"}, n_jobs=1, progress=False)
    assert [c.error for c in cells] == [None, None]
    none, full = (c.report for c in cells)
    assert full.options["remat_at"] == "^Layer$" and "remat_at" not in none.options
    assert _acts(full) <= 0.6 * _acts(none)


@pytest.mark.parametrize(("op_name", "path"), [
    # a remat's recomputation replays the forward name stack inside the backward one
    ("jit(step)/transpose(jvp(Encoder))/Block_2/jvp(Encoder)/Block_2/checkpoint/rematted_computation/"
     "Block_2.body/Block_2/Dense_0/dot_general", "Encoder/Block_2/Dense_0"),
    # nn.remat(Block) names its module twice (block_23/block_23/attn)
    ("jit(step)/jvp(Net)/block_23/block_23/attn/dot_general", "Net/block_23/attn"),
    # a model's own scope under jaxmem's NNX one of the same name
    ("jit(step)/jvp(ViT)/ViT/block_1/mlp/dot_general", "ViT/block_1/mlp"),
    # a function's qualified name in the stack is no module (the step's rng dict for dropout)
    ("jit(step)/jvp(GPT)/drop/train_step.<locals>.loss_fn.<locals>.<dictcomp>/random_bits", "GPT/drop"),
])
def test_one_module_has_one_path(op_name, path):
    assert opnames.module_path(op_name) == path


@pytest.mark.parametrize(("op_name", "prim"), [
    ("jit(step)/transpose(jvp(mul))", "mul"),                  # never "mul))" (the stray parentheses)
    ("jit(step)/jvp(Gemma/mul)", "mul"),
    ("jit(step)/jvp()/broadcast_in_dim:trainable['a']['b']", "broadcast_in_dim"),
    ("broadcast.63", "broadcast"),
    ("jit(step)/(trainable['x'].value:trainable['y'].value)", ""),   # no primitive named: the opcode is used
])
def test_the_primitive_of_an_op_name_is_a_bare_name(op_name, prim):
    assert opnames.primitive(op_name) == prim


def test_a_pmap_style_batchnorm_analyzes_unchanged_with_its_axis_bound_to_the_data_axes():
    args = {"preset": "tiny"}
    plain = _run("models/resnet.py", mesh="data=8", args=args)
    pmap = _run("models/resnet.py", mesh="data=8", args={**args, "axis_name": "batch"})
    assert pmap.options["collective_axis"] == "batch" and "collective_axis" not in plain.options
    # the statistics' mean over the 8 devices is the global batch mean jit computes: the same program
    assert abs(pmap.per_device_peak_bytes - plain.per_device_peak_bytes) <= 0.01 * plain.per_device_peak_bytes
    assert pmap.breakdown["other_state"] == plain.breakdown["other_state"]   # batch_stats carried as before
    assert any("data" in c["axes"] for c in pmap.step_time["collectives"] if c["kind"] == "all-reduce")


NNX_PMEAN = """
import jax, jax.numpy as jnp, optax, jaxmem
from flax import nnx
class Net(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(16, 32, rngs=rngs)
        self.bn = nnx.BatchNorm(32, axis_name="devices", rngs=rngs)
    def __call__(self, x):
        return jax.lax.pmean(self.bn(self.lin(x)), "devices")
def workload():
    return jaxmem.Workload(model=lambda rngs: Net(rngs), loss=lambda m, b: m(b["x"]).mean(),
                           batch={"x": jax.ShapeDtypeStruct((32, 16), jnp.float32)})
"""


def test_an_nnx_models_own_axis_name_is_bound_too(tmp_path):
    f = tmp_path / "nnx_pmean.py"
    f.write_text(NNX_PMEAN)
    r = _run(str(f), mesh="data=4")
    assert r.options["collective_axis"] == "devices"
    one = _run(str(f), mesh="data=1")   # one device: one group, the axis of size 1
    assert one.options["collective_axis"] == "devices"


def test_remat_block_finds_the_scanned_block_of_an_nnx_scan_over_nnx_vmap_layers():
    """Layers stacked by nnx.vmap and run by nnx.scan (fixtures/nnx_scan_vmap.py, as Flax's docs stack them):
    the block advise and compare --remats checkpoint is the scanned Block."""
    from jaxmem.analysis import run
    from jaxmem.program.options import AnalyzeOptions

    model = str(pathlib.Path(__file__).resolve().parent / "fixtures" / "nnx_scan_vmap.py")
    assert run.remat_block(model, AnalyzeOptions(gpu="h100", mesh="data=1")) == "^Block$"
