"""Rules as data (jaxmem/program/rules.py): --rules files in MaxText's format, applied before the
layout's own rules with flax's first-free-rule semantics; the file's content decides the step."""

import json
import shutil

import pytest
from click.testing import CliRunner
from conftest import MODELS, build_step

import jaxmem
from jaxmem import cli
from jaxmem.errors import UserError
from jaxmem.plan import compare
from jaxmem.program import layouts, rules

RULES = MODELS.parent / "tests" / "fixtures" / "rules"
LLAMA = MODELS / "llama.py"


def spec(shape, names, layout, mesh, user):
    ms = layouts.parse_mesh(mesh)
    issues = []
    return rules.leaf_spec("w", shape, 4, names, rules.rule_set(layout, ms, user), ms, issues), issues


def test_a_maxtext_config_is_read_with_or_without_pyyaml():
    text = (RULES / "maxtext_style.yml").read_text()
    parsed = rules.parse(text, "maxtext_style.yml")
    assert [(r.name, r.axes) for r in parsed[:4]] == [
        ("mlp", ("fsdp_transpose", "tensor")), ("embed", ("fsdp", "fsdp_transpose", "context", "expert")),
        ("embed", ("fsdp", "context", "expert")), ("exp", ("expert",))]
    assert parsed[-1] == rules.Rule("kv", None, "maxtext_style.yml rule 8")     # []: kept whole on purpose
    assert rules.parse(json.dumps(rules._flow_list(text, "m")), "maxtext_style.yml") == parsed
    # a JSON list, and a JSON mapping with the key
    assert rules.parse('[["embed", "fsdp"]]', "r.json") == (rules.Rule("embed", ("fsdp",), "r.json rule 1"),)
    assert rules.parse('{"logical_axis_rules": [["embed", null]]}', "r.json")[0].axes is None


@pytest.mark.parametrize("text,message", [
    ('[["embed", "fsdp"], ["embed"]]', r"r.json rule 2 \[\"embed\"\]: expected \[logical_name, mesh_axis"),
    ('[["embed", ["fsdp", "fsdp"]]]', "r.json rule 1 .*uses the axis fsdp twice"),
    ('[["embed", 3]]', "r.json rule 1"),
    ('{"rules": []}', "without a `logical_axis_rules` key"),
    ('"embed"', "expected a list of"),
    ("[[unclosed", "r.json"),
])
def test_a_malformed_rules_file_is_refused_naming_the_rule(text, message):
    with pytest.raises(UserError, match=message):
        rules.parse(text, "r.json")


def test_user_rules_come_first_and_the_first_rule_whose_axes_are_free_wins():
    user = rules.parse('[["mlp", "tensor"], ["embed", "tensor"], ["embed", "fsdp"]]', "r.json")
    # embed -> tensor is skipped: tensor already splits the mlp dim; the next embed rule applies
    assert spec((256, 64), ("mlp", "embed"), "fsdp_tp", "fsdp=4,tensor=2", user)[0] == ("tensor", "fsdp")
    # the layout's rules alone would split embed over fsdp and mlp over tensor too, in dim order of the rules
    assert spec((256, 64), ("mlp", "embed"), "fsdp_tp", "fsdp=4,tensor=2", ())[0] == ("tensor", "fsdp")
    mt = rules.parse((RULES / "maxtext_style.yml").read_text(), "m.yml")
    # MaxText's embed rule names fsdp and expert: on an expert mesh it takes both, before the experts dim
    assert spec((2, 8, 64, 128), ("layers", "exp", "embed", "mlp"), "fsdp", "fsdp=2,expert=2,tensor=2", mt)[0] == (
        None, None, ("fsdp", "expert"), "tensor")


def test_a_rule_may_name_axes_the_mesh_lacks_and_aliases_find_the_role():
    user = rules.parse('[["embed", "context"], ["mlp", "model"]]', "r.json")
    # no context axis: the rule is skipped and the layout's embed -> fsdp applies; model is the tensor axis
    assert spec((64, 256), ("embed", "mlp"), "fsdp", "fsdp=4,tensor=2", user)[0] == ("fsdp", "tensor")


def test_a_null_rule_keeps_the_dim_whole_and_fsdp_takes_another():
    user = rules.parse('[["embed", null]]', "r.json")
    assert spec((64, 256), ("embed", "mlp"), "fsdp", "fsdp=8", user)[0] == (None, "fsdp")


def test_user_rules_reach_the_activations_first():
    ms = layouts.parse_mesh("data=2,fsdp=2,context=2")
    acts = rules.rule_set("fsdp", ms, rules.parse('[["length", "fsdp"], ["kv", null]]', "r.json")).activations
    assert acts[:2] == (("length", "fsdp"), ("kv", None))
    assert ("batch", ("data", "fsdp")) in acts and ("length", "context") in acts


def test_a_rule_that_does_not_divide_is_reported_naming_it():
    user = rules.parse('[["embed", "fsdp"]]', "r.json")
    s, issues = spec((6, 4096), ("embed", "vocab"), "dp", "fsdp=4", user)
    assert s == (None, None)
    assert [i.reason for i in issues] == ["dim 0 (embed=6) not divisible by fsdp=4"]


def test_rules_file_errors_exit_2_before_any_compile(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[["embed", ["fsdp", "fsdp"]]]')
    for path, message in ((bad, "bad.json rule 1"), (tmp_path / "missing.json", "cannot read it")):
        r = CliRunner().invoke(cli.main, ["analyze", str(LLAMA), "--arg", "preset=tiny", "--gpu", "h100",
                                          "--mesh", "fsdp=4", "--rules", str(path)])
        assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_the_rules_files_content_decides_the_step(tmp_path):
    path = tmp_path / "rules.json"
    shutil.copy(RULES / "zero3_all.json", path)
    opts = {"gpu": "h100", "args": {"preset": "tiny"}, "mesh": "data=2,fsdp=4", "batch": 16, "explain": False}
    hsdp = jaxmem.analyze(LLAMA, **opts)
    everywhere = jaxmem.analyze(LLAMA, rules=str(path), **opts)
    # HSDP: the state over fsdp's 4 devices; the file's embed -> [data, fsdp]: over all 8 (every llama leaf has embed)
    assert hsdp.breakdown["params"] * 4 == hsdp.param_count * 4
    assert everywhere.breakdown["params"] * 8 == everywhere.param_count * 4
    assert everywhere.options["rules"] == str(path) and len(everywhere.options["rules_sha256"]) == 64
    path.write_text("[]")   # the same name, other content: another step, not the cached answer
    again = jaxmem.analyze(LLAMA, rules=str(path), **opts)
    assert again.breakdown["params"] == hsdp.breakdown["params"]
    assert again.options["rules_sha256"] != everywhere.options["rules_sha256"]


def test_compare_takes_rules_files_as_a_grid_axis(tmp_path):
    assert compare.grid({"rules": "a.json,b.json"}) == [{"rules": "a.json"}, {"rules": "b.json"}]
    r = CliRunner().invoke(cli.main, ["compare", str(LLAMA), "--rules", f"{tmp_path}/none.json,b.json"])
    assert r.exit_code == 2 and "none.json: cannot read it" in r.output


def test_build_step_uses_the_rules(tmp_path):
    leaves = {leaf.path: leaf for leaf in build_step(LLAMA, mesh="data=2,fsdp=4", model_args={"preset": "tiny"},
                                                       batch=16, rules=str(RULES / "zero3_all.json"))[1].leaves}
    assert leaves["params:embed/embedding"].spec == (None, ("data", "fsdp"))   # (vocab, embed); vocab kept whole


def test_nnx_sharding_metadata_takes_the_rules_too(tmp_path):
    path = tmp_path / "mlp_first.json"
    path.write_text('[["mlp", "fsdp"]]')
    nnx_model = MODELS.parent / "tests" / "fixtures" / "nnx_experts.py"
    built = build_step(nnx_model, mesh="fsdp=2,expert=4", rules=str(path))[1]
    by_rules = {leaf.path: leaf.spec for leaf in built.leaves}
    assert by_rules["params:wi/value"] == ("expert", None, "fsdp")          # (exp, embed, mlp)
    assert by_rules["params:dense/kernel/value"] == (None, "fsdp")           # (embed, mlp)
    layout = {leaf.path: leaf.spec for leaf in build_step(nnx_model, mesh="fsdp=2,expert=4")[1].leaves}
    assert layout["params:wi/value"] == ("expert", "fsdp", None)


# -- issue 25: a rules file is read bounded and without blocking --------------------------------------

def test_a_fifo_or_a_device_as_rules_is_exit_2_at_once(tmp_path):
    import os
    import time

    os.mkfifo(tmp_path / "rules.json")
    t0 = time.monotonic()
    for path, kind in ((tmp_path / "rules.json", "a FIFO"), ("/dev/zero", "a device")):
        r = CliRunner().invoke(cli.main, ["analyze", "tests/fixtures/mlp_small.py", "--rules", str(path)])
        assert r.exit_code == 2 and f"--rules {path}: is {kind}" in r.stderr, r.output
    assert time.monotonic() - t0 < 20
    assert rules.digest(str(tmp_path / "rules.json")) is None   # the digest's read never waits either


def test_deep_nesting_and_huge_numbers_in_rules_are_exit_2(tmp_path):
    for name, text, msg in (("deep.json", "[" * 100_000 + "]" * 100_000, "nested more than"),
                            ("deep.yaml", "- " * 3000 + "x\n", "nested more than"),
                            ("num.yaml", "- [mlp, " + "1" * 5000 + "]\n", "--rules num.yaml")):
        (tmp_path / name).write_text(text)
        with pytest.raises(UserError, match=msg):
            rules.load(str(tmp_path / name))


def test_a_rule_naming_one_axis_twice_through_its_alias_is_exit_2():
    mesh = layouts.parse_mesh("data=2,tensor=2")
    user = rules.parse(json.dumps([["mlp", ["tensor", "model"]]]), "r.json")
    with pytest.raises(UserError, match=r"r.json rule 1 \[\"mlp\", \[\"tensor\", \"model\"\]\]: names the axis "
                                        r"tensor twice"):
        rules.rule_set("fsdp_tp", mesh, user)
