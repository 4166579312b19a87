"""Code written for JAX's explicit sharding analyzes as written (--axis-types explicit, API
axis_types=, Workload(axis_types=)): the mesh's axes are Explicit, weights sit where their metadata
says, and under Auto axes such a model is one clear error naming the fix."""
import json
import pathlib

import pytest
from click.testing import CliRunner

from jaxmem.cli import main

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
OUTSIDE = pathlib.Path(__file__).resolve().parents[2] / "shared" / "outside"
H100 = ["--gpu", "h100", "--mesh", "fsdp=2"]


def _json(*args):
    r = CliRunner().invoke(main, ["analyze", *map(str, args), *H100, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _specs(d):
    return {s["path"]: s["spec"] for s in d["shardings"] if s["path"].startswith("params:")}


def test_nnx_weights_sit_where_their_kernel_metadata_says_and_the_workload_asks_for_explicit():
    d = _json(FIXTURES / "explicit_nnx.py")    # no flag: the Workload says axis_types="explicit"
    assert d["options"]["axis_types"] == "explicit"
    specs = _specs(d)
    assert len(specs) == 4
    for path, spec in specs.items():   # kernel_metadata={"out_sharding": ...}, not the layout's choice
        assert spec == ([None, "fsdp"] if "/up/" in path else ["fsdp", None]), (path, spec)
    # each weight split in two: half its bytes per device
    assert d["breakdown"]["params"] == 4 * 128 * 512 * 4 // 2


def test_the_same_model_under_auto_axes_is_exit_2_naming_axis_types_explicit():
    r = CliRunner().invoke(main, ["analyze", str(FIXTURES / "explicit_nnx.py"), "--arg", "explicit=false", *H100])
    assert r.exit_code == 2
    assert "--axis-types explicit" in r.output and "Traceback" not in r.output


@pytest.mark.skipif(not (OUTSIDE / "nnx_explicit.py").is_file(), reason="../shared/outside is not beside the checkout")
def test_an_outside_model_with_param_out_sharding_analyzes_with_the_flag():
    d = _json(OUTSIDE / "nnx_explicit.py", "--axis-types", "explicit")
    assert _specs(d) == {"params:up/w/value": ["fsdp", None], "params:down/w/value": [None, "fsdp"]}


def test_linen_einsums_with_out_sharding_analyze_under_explicit_axes():
    d = _json(FIXTURES / "explicit_linen.py", "--axis-types", "explicit")
    assert d["breakdown"]["params"] == 2 * 128 * 512 * 4 // 2   # the layout's fsdp split, both kernels


def test_the_api_takes_axis_types():
    import jaxmem

    r = jaxmem.analyze(str(FIXTURES / "explicit_linen.py"), gpu="h100", mesh="fsdp=2", axis_types="explicit")
    assert r.options["axis_types"] == "explicit"


def test_auto_is_the_default_and_leaves_the_report_as_it_was(models_dir):
    d = _json(models_dir / "mlp.py", "--arg", "preset=tiny")
    assert "axis_types" not in d["options"]


def test_an_unknown_workload_axis_type_is_a_user_error(tmp_path):
    f = tmp_path / "m.py"
    f.write_text((FIXTURES / "explicit_nnx.py").read_text().replace('"explicit" if explicit else None', '"sideways"'))
    r = CliRunner().invoke(main, ["analyze", str(f), *H100])
    assert r.exit_code == 2 and "axis_types='sideways'" in r.output


TRAINERS = FIXTURES / "trainers"


def test_an_unannotated_head_stays_replicated_under_explicit_axes_and_the_step_traces():
    # kernels annotated with out_sharding, the head's nnx.Linear not: its bias split over fsdp made
    # the add P('fsdp', None, 'fsdp') (ShardingTypeError); as jax.make_mesh + init place it, it is whole
    r = CliRunner().invoke(main, ["analyze", str(TRAINERS / "explicit_head.py"), "--gpu", "h100", "--mesh",
                                  "fsdp=4,tensor=2", "--axis-types", "explicit", "--json", "--no-explain"])
    assert r.exit_code == 0, r.output
    specs = _specs(json.loads(r.output))
    assert specs["params:head/bias/value"] == [None] and specs["params:head/kernel/value"] == [None, None]
    assert specs["params:block/up/value"] == ["fsdp", "tensor"]


def test_an_auto_style_model_under_explicit_axes_is_told_which_call_needs_out_sharding():
    r = CliRunner().invoke(main, ["analyze", str(TRAINERS / "auto_style.py"), "--gpu", "h100", "--mesh",
                                  "fsdp=2,tensor=2", "--layout", "fsdp_tp", "--axis-types", "explicit"])
    assert r.exit_code == 2, r.output
    line = next(i for i, s in enumerate((TRAINERS / "auto_style.py").read_text().splitlines(), 1)
                if "return self.down(" in s)
    assert f"auto_style.py:{line} in __call__ needs out_sharding=" in r.output
    assert "--axis-types auto" in r.output and "Traceback" not in r.output
