"""--moment-dtype bf16: the built-in optimizers keep their moments in bf16, byte for byte as counted by hand."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from jaxmem.cli import main
from jaxmem.pipeline import AnalyzeOptions, analyze_file, command_line
from jaxmem.program import state

FIX = Path(__file__).parent / "fixtures"
MLP = FIX / "finetune_mlp.py"             # Dense a: 37->53, b: 53->29, head: 29->11; no optimizer of its own
OWN = FIX / "scan_bf16.py"                # a workload with its own optimizer
PARAMS = (37 * 53 + 53) + (53 * 29 + 29) + (29 * 11 + 11)
COUNT = 4                                 # an optax step counter: one int32


def analyze(**kw):
    return analyze_file(str(MLP), AnalyzeOptions(gpu="h100", explain=False, **kw))


@pytest.mark.parametrize(("optimizer", "moments", "counters"), [
    ("adamw", 2, 1), ("adam", 2, 1), ("lion", 1, 1), ("momentum", 1, 0)])
def test_bf16_moments_are_two_bytes_per_parameter_per_moment_plus_the_counters(optimizer, moments, counters):
    r = analyze(optimizer=optimizer, moment_dtype="bf16")
    assert r.breakdown["params"] == PARAMS * 4                    # the parameters stay fp32
    assert r.breakdown["optimizer_state"] == PARAMS * 2 * moments + COUNT * counters
    assert r.options["moment_dtype"] == "bf16"


def test_the_default_adamw_takes_bf16_moments_and_halves_its_state():
    fp32 = analyze()
    bf16 = analyze(moment_dtype="bf16")
    assert fp32.breakdown["optimizer_state"] == PARAMS * 4 * 2 + COUNT
    assert bf16.breakdown["optimizer_state"] == PARAMS * 2 * 2 + COUNT
    assert "moment_dtype" not in fp32.options


def test_adafactor_keeps_its_factored_second_moments_in_bf16():
    fp32 = analyze(optimizer="adafactor")
    bf16 = analyze(optimizer="adafactor", moment_dtype="bf16")
    # every float of Adafactor's state halves; its counter (int32) stays
    assert bf16.breakdown["optimizer_state"] - COUNT == (fp32.breakdown["optimizer_state"] - COUNT) // 2


def test_bf16_moments_update_as_optax_computes_them_and_stay_bf16_across_steps():
    params = {"w": jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)}
    grads = {"w": jnp.linspace(0.5, -0.7, 12, dtype=jnp.float32).reshape(3, 4)}
    tx = state._BF16_MOMENTS["adamw"]()
    ours = state.moments_in(tx, jnp.bfloat16)
    s = ours.init(params)
    assert {x.dtype for x in jax.tree.leaves(s)} == {jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.int32)}
    u, s = jax.jit(ours.update)(grads, s, params)
    # the first update is optax's adamw(mu_dtype=bf16) exactly: the moments are cast after the update uses them
    want, _ = tx.update(grads, tx.init(params), params)
    # bit for bit from jax 0.10; jax 0.9's XLA fuses the update differently: within one float32 ulp
    np.testing.assert_array_max_ulp(np.asarray(u["w"]), np.asarray(want["w"]), maxulp=1)
    u, s = jax.jit(ours.update)(grads, s, params)
    assert s[0].mu["w"].dtype == s[0].nu["w"].dtype == jnp.bfloat16
    assert u["w"].dtype == jnp.float32


def _cli(*args):
    return CliRunner().invoke(main, ["analyze", *map(str, args), "--gpu", "h100", "--no-explain"])


def test_moment_dtype_on_a_workloads_own_optimizer_is_exit_2_naming_why():
    res = _cli(OWN, "--moment-dtype", "bf16")
    assert res.exit_code == 2, res.output
    assert "--moment-dtype bf16: the workload gives its own optimizer" in res.output
    assert "--optimizer adamw" in res.output and "Traceback" not in res.output


def test_moment_dtype_with_plain_sgd_is_exit_2():
    res = _cli(MLP, "--optimizer", "sgd", "--moment-dtype", "bf16")
    assert res.exit_code == 2, res.output
    assert "--optimizer sgd keeps no moments" in res.output


def test_moment_dtype_int8_is_no_choice():
    res = _cli(MLP, "--moment-dtype", "int8")
    assert res.exit_code == 2 and "int8" in res.output


def test_command_line_writes_moment_dtype_back():
    assert "--moment-dtype bf16" in command_line("m.py", AnalyzeOptions(moment_dtype="bf16"))


def test_a_config_json_model_trains_with_jaxmems_adamw_and_takes_bf16_moments():
    r = analyze_file(str(FIX / "hf" / "llama"), AnalyzeOptions(gpu="h100", explain=False, moment_dtype="bf16"))
    assert r.options["optimizer"] == "adamw"
    assert r.breakdown["optimizer_state"] == r.param_count * 2 * 2 + COUNT


def test_the_api_and_compare_take_moment_dtype_as_analyze_does():
    import jaxmem

    r = jaxmem.analyze(str(MLP), gpu="h100", moment_dtype="bf16", explain=False)
    assert r.breakdown["optimizer_state"] == PARAMS * 2 * 2 + COUNT
    cmd = main.commands["compare"]
    ctx = cmd.make_context("compare", [str(MLP), "--moment-dtype", "bf16", "--precisions", "fp32,bf16"])
    assert ctx.params["moment_dtype"] == "bf16"
