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
