"""--precision fp8 (jaxmem/program/fp8.py): the dense/einsum matmuls in FP8 with delayed scaling,
their scaling state in the breakdown, the step time at the card's FP8 rate, and the refusals."""

from __future__ import annotations

import pathlib
import re

import pytest
from click.testing import CliRunner

import jaxmem
from jaxmem import cli
from jaxmem.compiler import compiled, steptime
from jaxmem.xla import hlo_text

from conftest import build_step  # noqa: I001

# per op: three scales of one float32 and three amax histories of 1024 (Flax's Fp8DotGeneralBase)
META_BYTES = 3 * 4 + 3 * 1024 * 4


def _fp8(model, **args):
    return jaxmem.analyze(model, gpu="h100", precision="fp8", cache=False, args=args)


def test_every_dense_layer_runs_its_dots_in_fp8_and_keeps_its_scaling_state():
    r = _fp8("models/mlp.py", preset="tiny")   # 4 Dense layers, nothing else multiplies a weight
    assert r.breakdown["fp8_state"] == 4 * META_BYTES
    peaks = {p["kind"]: p["flops"] for p in r.step_time["compute_peaks"]}
    dots = sum(f for k, f in peaks.items() if k != "non-dot")
    assert peaks["fp8"] / dots > 0.9
    # master weights and optimizer state as under bf16: fp32
    bf16 = jaxmem.analyze("models/mlp.py", gpu="h100", precision="bf16", cache=False, args={"preset": "tiny"})
    assert (r.breakdown["params"], r.breakdown["optimizer_state"]) == (bf16.breakdown["params"],
                                                                       bf16.breakdown["optimizer_state"])
    assert "fp8_state" not in bf16.breakdown


def test_the_compiled_program_holds_e4m3_and_e5m2_dot_operands():
    _, built = build_step("models/mlp.py", precision="fp8", model_args={"preset": "tiny"})
    art = compiled.compile_step(built, explain=False, cache=False)
    module = hlo_text.parse_module(art.hlo_text)
    kinds = [k for k, _, _ in steptime.dot_flops(module)]
    assert kinds and set(kinds) == {"fp8"}
    assert re.search(r"f8e4m3fn\[", art.hlo_text) and re.search(r"f8e5m2\[", art.hlo_text)  # forward; gradients


def test_llama_scanned_layers_and_tied_head_all_take_fp8():
    r = _fp8("models/llama.py", preset="tiny")
    # 2 scanned layers x (q, k, v, o, gate, up, down) + the tied embedding's attend
    assert r.breakdown["fp8_state"] == (2 * 7 + 1) * META_BYTES
    peaks = {p["kind"]: p["flops"] for p in r.step_time["compute_peaks"]}
    assert peaks["fp8"] > 10 * peaks.get("bf16", 0) / 2   # attention's q.k and p.v stay bf16: no weight in them


def test_llama_with_maxtext_numerics_keeps_its_output_head_out_of_fp8_as_maxtext_does():
    r = _fp8("models/llama.py", preset="tiny", numerics="maxtext")
    assert r.breakdown["fp8_state"] == 2 * 7 * META_BYTES   # the layers' seven matmuls; not the tied attend
    untied = _fp8("models/llama.py", preset="tiny", numerics="maxtext", tie_embeddings=False)
    assert untied.breakdown["fp8_state"] == 2 * 7 * META_BYTES   # nor an lm_head Dense


def test_a_workload_excludes_modules_from_fp8_by_path(tmp_path):
    f = tmp_path / "excl.py"
    f.write_text("import runpy, dataclasses\n"
                 "mlp = runpy.run_path('models/mlp.py')\n"
                 "def workload(**kw):\n"
                 "    return dataclasses.replace(mlp['workload']('tiny'), fp8_exclude='head$')\n")
    r = jaxmem.analyze(str(f), gpu="h100", precision="fp8", cache=False)
    assert r.breakdown["fp8_state"] == 3 * META_BYTES   # 4 Dense layers, the head excluded
    bad = tmp_path / "bad.py"
    bad.write_text(f.read_text().replace("'head$'", "'head('"))
    res = CliRunner().invoke(cli.main, ["analyze", str(bad), "--gpu", "h100", "--precision", "fp8", "--no-cache"])
    assert res.exit_code == 2 and "fp8_exclude='head('" in res.output and "regular expression" in res.output


def test_an_nnx_model_takes_fp8_too():
    r = _fp8("models/mlp_nnx.py")
    assert r.breakdown["fp8_state"] > 0 and r.breakdown["fp8_state"] % META_BYTES == 0


@pytest.mark.parametrize("gpu", ["a100", "rtx-a6000"])
def test_fp8_on_a_card_without_fp8_is_exit_2_naming_the_cards_that_have_it(gpu):
    r = CliRunner().invoke(cli.main, ["analyze", "models/mlp.py", "--arg", "preset=tiny", "--gpu", gpu,
                                      "--precision", "fp8"])
    assert r.exit_code == 2 and "h100, h200, b200" in r.output


def test_fp8_with_lora_is_exit_2():
    r = CliRunner().invoke(cli.main, ["analyze", "models/mlp.py", "--arg", "preset=tiny", "--gpu", "h100",
                                      "--precision", "fp8", "--lora", "4"])
    assert r.exit_code == 2 and "--lora" in r.output


def test_a_scan_listing_only_params_carries_one_scaling_state_per_layer():
    # nn.scan(variable_axes={"params": 0}) as most scan code writes it: jaxmem routes the FP8 collection
    # through the scan itself, stacked on the layer axis like the weights
    r = jaxmem.analyze("tests/fixtures/fp8_scan_params_only.py", gpu="h100", precision="fp8", cache=False)
    assert r.breakdown["fp8_state"] == 2 * META_BYTES   # 2 scanned Dense layers, one state each


def test_a_scan_made_at_import_without_room_for_the_scaling_state_says_what_to_add(tmp_path):
    # a scan class built once at import keeps the model's own variable_axes: told what to add
    src = pathlib.Path("tests/fixtures/fp8_scan_params_only.py").read_text()
    src = src.replace("class Model(nn.Module):", "Scanned = nn.scan(Layer, variable_axes={'params': 0}, "
                      "split_rngs={'params': True}, length=2)\n\n\nclass Model(nn.Module):")
    src = src.replace("nn.scan(Layer, variable_axes={\"params\": 0}, split_rngs={\"params\": True}, length=2)()",
                      "Scanned()")
    f = tmp_path / "import_scan.py"
    f.write_text(src)
    r = CliRunner().invoke(cli.main, ["analyze", str(f), "--gpu", "h100", "--precision", "fp8"])
    assert r.exit_code == 2 and "variable_axes" in r.output and "_overwrite_with_gradient" in r.output
