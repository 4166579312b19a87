"""Logical names are never replicated silently (issue 51 points 2 and 5): known conventions are applied
as data and stated with their citation; a name no rule maps is exit 2 unless --unmapped replicate; the
fallback's poor splits and every state leaf are visible."""

import json
import pathlib

import pytest
from click.testing import CliRunner
from conftest import MODELS

import jaxmem
from jaxmem import cli
from jaxmem.errors import UserError
from jaxmem.program import conventions, layouts, rules

ROOT = MODELS.parent
UNMAPPED = ROOT / "tests" / "fixtures" / "unmapped_names.py"
BV_VIT = ROOT / "benchmarks" / "outside" / "bv_vit.py"


def _rules(layout="fsdp", mesh="data=8", user=()):
    ms = layouts.parse_mesh(mesh)
    return rules.rule_set(layout, ms, user), ms


def _activation(rs, name):
    return next(spec for n, spec in rs.activations if n == name)


@pytest.mark.parametrize("mesh,batch", [("data=8", "data"), ("data=2,fsdp=4", ("data", "fsdp")),
                                        ("fsdp=8", "fsdp")])
def test_big_visions_act_batch_splits_over_the_batch_axes_of_any_mesh_and_its_other_names_stay_whole(mesh, batch):
    rs, ms = _rules(mesh=mesh)
    assert _activation(rs, "act_batch") == batch
    assert _activation(rs, "act_len") is None and _activation(rs, "act_emb") is None
    source, what = rules.origin(rs, "act_batch", ms)
    assert source == "default" and "google-research/big_vision big_vision/train.py" in what


def test_every_convention_is_cited_and_never_overrides_jaxmems_own_names():
    for conv in conventions.CONVENTIONS:
        assert conv.repo.count("/") == 1 and conv.path and conv.what
        assert all(like in conventions.LIKES or like is None for _, _, like in conv.rules)
    table = conventions.table(rules.JAXMEM_NAMES)
    assert not set(table) & rules.JAXMEM_NAMES
    rs, ms = _rules()
    # t5x's "embed" is replicated in t5x; jaxmem's fsdp layout splits it: jaxmem's rule is the one applied
    assert rules.origin(rs, "embed", ms) == ("default", "jaxmem") and dict(rs.params)["embed"] == ("data",)
    # t5x's joined_kv acts as heads: over the tensor axis under tp
    tp, _ = _rules("tp", "data=4,model=2")
    assert dict(tp.params)["joined_kv"] == ("model",) and dict(tp.params)["kv"] is None


def test_an_unmapped_name_is_refused_listing_each_name_where_it_is_used_and_the_rules_that_map_it():
    rs, ms = _rules()
    used = {"act_batch": ["vit.py:74 in Block.__call__"], "my_batch": ["m.py:3 in f", "m.py:9 in g"],
            "my_in": ["parameter w dim 0"]}
    with pytest.raises(UserError) as e:
        rules.check_unmapped(used, rs, ms)
    text = str(e.value)
    assert "2 logical axis name(s)" in text and "act_batch" not in text.split("Give")[0]
    assert "my_batch: used at m.py:3 in f; m.py:9 in g" in text and "my_in: used at parameter w dim 0" in text
    assert '["my_batch", "data"]' in text and '["my_in", null]' in text and "--unmapped replicate" in text
    rules.check_unmapped(used, rs, ms, "replicate")   # accepted as asked
    # a user rule to null keeps it whole on purpose: mapped
    user = rules.parse('[["my_batch", "data"], ["my_in", null]]', "r.json")
    rs, ms = _rules(user=user)
    rules.check_unmapped(used, rs, ms)
    rows = {r["name"]: r for r in rules.logical_rules(used, rs, ms)}
    assert rows["my_in"]["source"] == "user" and rows["my_in"]["mesh_axes"] == []
    assert rows["my_batch"]["convention"] == "--rules r.json rule 1" and rows["my_batch"]["mesh_axes"] == ["data"]
    assert rows["act_batch"]["source"] == "default" and rows["act_batch"]["convention"].startswith("big_vision")


def test_a_vocabulary_that_does_not_divide_is_split_on_its_hidden_size_and_the_padding_is_named():
    rs, ms = _rules()
    issues = []
    assert rules.leaf_spec("wte", (50257, 768), 4, None, rs, ms, issues) == (None, "data")
    [issue] = issues
    assert issue.kind == "poor_dimension" and issue.split_dim == 1 and issue.padded_to == 50304   # nanoGPT's
    issues = []
    assert rules.leaf_spec("wte", (50304, 768), 4, None, rs, ms, issues) == ("data", None) and not issues
    assert rules.padded(50257, 16) == 50304 and rules.padded(32000, 8) == 32000 and rules.padded(100, 32) == 256


@pytest.mark.slow
def test_the_cli_exits_2_on_unmapped_names_and_replicates_them_only_when_asked():
    run = CliRunner().invoke(cli.main, ["analyze", str(UNMAPPED), "--mesh", "data=8", "--gpu", "h100"])
    assert run.exit_code == 2 and "my_batch" in run.output and "--unmapped replicate" in run.output
    r = jaxmem.analyze(UNMAPPED, mesh="data=8", gpu="h100", unmapped="replicate")
    kinds = [w.kind for w in r.warnings]
    assert "batch_replicated" in kinds and "gathered_params_live" not in kinds   # the gathered buffers are the batch
    assert any("my_batch" in w.message and "unmapped_names.py:15" in w.message for w in r.warnings
               if w.kind == "batch_replicated")
    rows = {row["name"]: row for row in r.choices["logical_rules"]}
    assert rows["my_batch"]["source"] == "user" and rows["my_batch"]["convention"].startswith("--unmapped replicate")
    assert r.choices["sources"]["logical_rules"] == "user"


@pytest.mark.slow
def test_a_big_vision_vit_is_split_by_big_visions_rule_without_being_told_and_the_report_cites_it(tmp_path):
    r = jaxmem.analyze(BV_VIT, mesh="data=8", gpu="h100")
    assert {a["spec"] for a in r.activation_constraints["applied"]} == {"P('data', None, None)"}
    rows = {row["name"]: row for row in r.choices["logical_rules"]}
    assert rows["act_batch"]["mesh_axes"] == ["data"] and rows["act_emb"]["mesh_axes"] == []
    assert all(row["source"] == "default" and "big_vision" in row["convention"] for row in rows.values())
    assert "batch_replicated" not in [w.kind for w in r.warnings]
    # the user's own rule, the same as big_vision's, gives the same program and is stated as the user's
    path = pathlib.Path(tmp_path) / "bv.json"
    path.write_text(json.dumps([["act_batch", "data"]]))
    mine = jaxmem.analyze(BV_VIT, mesh="data=8", gpu="h100", rules=str(path))
    assert mine.per_device_peak_bytes == r.per_device_peak_bytes
    assert {row["name"]: row["source"] for row in mine.choices["logical_rules"]}["act_batch"] == "user"
    # every state leaf listed, its bytes the breakdown's
    leaves = r.state_leaves
    assert sum(x["device_bytes"] for x in leaves if x["category"] == "params") == r.breakdown["params"]
    assert sum(x["device_bytes"] for x in leaves if x["category"] == "optimizer_state") == \
        r.breakdown["optimizer_state"]
    assert len(leaves) > 20 and all(set(x) >= {"path", "category", "shape", "dtype", "spec", "device_bytes"}
                                    for x in leaves)


CUSTOM = ROOT / "tests" / "fixtures" / "custom_constraints.py"


@pytest.mark.slow
def test_a_hand_written_steps_constraints_are_traced_under_the_mesh_and_the_rules_as_a_model_files_are():
    """Workload(step=...) had been traced with no mesh and no rules: a bare PartitionSpec constraint (plain JAX
    under jax.set_mesh) failed to trace, a logical name was dropped without a word, an unmapped one accepted."""
    def peak(constraint, **kw):
        return jaxmem.analyze(CUSTOM, mesh="data=8", gpu="h100", model_args={"constraint": constraint}, **kw)

    bare, whole, logical = peak("bare"), peak("bare_whole"), peak("logical")
    assert bare.per_device_peak_bytes == logical.per_device_peak_bytes < whole.per_device_peak_bytes
    assert "batch_replicated" in [w.kind for w in whole.warnings] and not bare.warnings
    (row,) = logical.choices["logical_rules"]
    assert (row["name"], row["mesh_axes"], row["source"]) == ("act_batch", ["data"], "default")
    assert "big_vision/train.py" in row["convention"] and "custom_constraints.py:17" in row["used_at"][0]
    run = CliRunner().invoke(cli.main, ["analyze", str(CUSTOM), "--arg", "constraint=unmapped", "--mesh", "data=8",
                                        "--gpu", "h100"])
    assert run.exit_code == 2 and "my_rows: used at tests/fixtures/custom_constraints.py:18" in run.output
    assert peak("unmapped", unmapped="replicate").per_device_peak_bytes == whole.per_device_peak_bytes
