"""Equinox, first class (issue 51 point 6): jaxmem.equinox_workload builds the step of an eqx.Module, its
parameters and optimizer state exact against a hand count, --remat/--remat-at applied to its modules,
its modules named by attribute path with layer indices, and an Equinox model given as model= told the recipe."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

eqx = pytest.importorskip("equinox")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import jaxmem  # noqa: E402
from jaxmem.program.equinox import is_inexact  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
GPT = ROOT / "tests" / "fixtures" / "eqx_gpt.py"


def _fixture():
    spec = importlib.util.spec_from_file_location("eqx_gpt_fixture", GPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # its dataclasses (eqx modules) resolve their annotations there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def plain():
    return jaxmem.analyze(GPT, gpu="h100", depth=4)


def test_params_and_adamw_state_are_exact_against_a_hand_count(plain):
    n = _fixture().parameter_count()
    assert plain.param_count == n
    assert plain.breakdown["params"] == 4 * n                  # fp32, as the model creates them
    assert plain.breakdown["optimizer_state"] == 2 * 4 * n + 4   # adamw: mu and nu in fp32, and its int32 count
    assert plain.options["optimizer"] == "step's own (ScaleByAdamState)"


def test_modules_are_named_by_attribute_path_with_layer_indices(plain):
    paths = {m.module_path for m in plain.modules}
    assert {"loss_fn/GPT/blocks/0", "loss_fn/GPT/blocks/1", "loss_fn/GPT/blocks/2"} <= paths
    deep = jaxmem.analyze(GPT, gpu="h100", depth=5)
    assert any(m.module_path == "loss_fn/GPT/blocks/1/attn" for m in deep.modules)


def test_the_choices_say_the_step_is_the_models_own(plain):
    c = plain.choices
    assert (c["precision"], c["sources"]["precision"]) == ("the step's own", "model")
    assert (c["remat"], c["sources"]["remat"]) == ("the step's own", "model")


def test_remat_at_checkpoints_the_blocks_and_the_peak_changes(plain):
    every = jaxmem.analyze(GPT, gpu="h100", remat="full", remat_at="Block")
    assert every.options["remat_placed"] == ["blocks/0", "blocks/1", "blocks/2"]
    assert every.choices["remat"] == "full" and every.choices["sources"]["remat"] == "user"
    one = jaxmem.analyze(GPT, gpu="h100", remat="full", remat_at=r"blocks/1$")
    assert one.options["remat_placed"] == ["blocks/1"]
    assert every.per_device_peak_bytes < one.per_device_peak_bytes < plain.per_device_peak_bytes


def test_remat_at_that_finds_no_module_names_the_steps_modules_and_the_hook():
    with pytest.raises(jaxmem.UserError, match=r"finds no module in the step.*Block \(blocks/0\).*jax.checkpoint"):
        jaxmem.analyze(GPT, gpu="h100", remat="full", remat_at="NoSuchBlock")


def test_remat_without_remat_at_names_the_hook_to_write():
    with pytest.raises(jaxmem.UserError, match=r"its own `step`.*jaxmem.remat_policy\(remat\)"):
        jaxmem.analyze(GPT, gpu="h100", remat="full")


def test_abstract_parameters_are_kept_where_eqx_is_array_drops_them():
    model = eqx.filter_eval_shape(eqx.nn.Linear, 3, 4, key=jax.random.key(0))
    assert not jax.tree.leaves(eqx.filter(model, eqx.is_array))     # the trap: every parameter gone
    assert len(jax.tree.leaves(eqx.filter(model, is_inexact))) == 2   # weight and bias
    wl = jaxmem.equinox_workload(model, lambda m, b: jax.vmap(m)(b["x"]).sum(), optax.sgd(0.1),
                                 {"x": jax.ShapeDtypeStruct((2, 3), jnp.float32)})
    assert [x.shape for x in jax.tree.leaves(wl.state["params"])] == [(4, 3), (4,)]


def test_an_equinox_module_given_as_model_gets_the_recipe():
    model = eqx.filter_eval_shape(eqx.nn.Linear, 3, 4, key=jax.random.key(0))
    wl = jaxmem.Workload(model=model, batch={"x": jax.ShapeDtypeStruct((2, 3), jnp.float32)},
                         loss=lambda m, b: m(b["x"]).sum())
    with pytest.raises(jaxmem.UserError, match=r"is an equinox.Module \(Linear\).*jaxmem.equinox_workload"):
        jaxmem.analyze(wl, gpu="h100")


def test_the_documented_equinox_recipe_runs_with_its_printed_command(tmp_path, monkeypatch):
    import shlex

    from click.testing import CliRunner

    from jaxmem import cli

    text = (ROOT / "docs" / "model-files.md").read_text().split("<!-- equinox example -->", 1)[1]
    code = text.split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"
    command = text.split("Saved as `my_model.py`:", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    (tmp_path / "my_model.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)
    r = CliRunner().invoke(cli.main, [*argv[1:], "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    d = __import__("json").loads(r.output)
    assert d["param_count"] == 4 * (512 * 512 + 512)
    assert d["options"]["remat_placed"] == ["layers/0", "layers/1", "layers/2", "layers/3"]
