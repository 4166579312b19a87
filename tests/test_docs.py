"""The docs run as printed: generated reference, samples from real runs, the model-file example."""

import json

import pytest
from click.testing import CliRunner

import jaxmem
from jaxmem import cli

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("name", jaxmem.REMAT_POLICIES)
def test_remat_policy_answers_every_remat_value(name):
    import jax

    policy = jaxmem.remat_policy(name)
    assert callable(policy)
    if name == "none":  # recompute nothing: the recipe `nn.remat(Block, policy=...)` works at the default
        assert policy is jax.checkpoint_policies.everything_saveable
    if name == "full":
        assert policy is jax.checkpoint_policies.nothing_saveable


def test_remat_policy_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="choose one of none, full"):
        jaxmem.remat_policy("some")


def _peak(*args):
    r = invoke("analyze", FIX / "remat_none.py", "--gpu", "h100", "--json", *args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    return d["per_device_peak_bytes"], d["xla"]["temp"]


def test_remat_none_saves_everything_like_no_remat():
    """nn.remat(policy=remat_policy("none")) without CSE barriers compiles to the unwrapped step's memory."""
    unwrapped = _peak("--arg", "wrap=false")
    assert _peak("--arg", "wrap=true", "--arg", "prevent_cse=false") == unwrapped


def test_compare_help_says_json_is_a_list():
    """compare --json prints a list of rows (jaxmem/plan/compare.py: to_json), not one object."""
    text = invoke("compare", "--help").output
    assert "JSON list" in text and "one JSON object" not in text
    assert "one JSON object" in invoke("analyze", "--help").output  # analyze's is one object


def _script(name):
    """A docs/ script as a module (docs/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"docs_{name}", ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_generated_from_every_commands_help():
    gen = _script("gen_cli")
    fresh = gen.render()
    for name in cli.main.commands:  # every command, each exactly as its --help prints it
        assert f"## `jaxmem {name}`" in fresh
    printed = CliRunner().invoke(cli.main, ["gpus", "--help"], prog_name="jaxmem").output
    assert printed.rstrip() in fresh
    committed = (ROOT / "docs" / "cli.md").read_text()
    assert fresh == committed, "docs/cli.md is out of date: run `python docs/gen_cli.py` and commit docs/cli.md"
