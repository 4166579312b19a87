import pytest

from jaxmem.errors import UserError
from jaxmem.program import layouts, rules


def test_parse_mesh_orders_axes_and_finds_roles():
    m = layouts.parse_mesh("data=4, model=2")
    assert m.axes == (("data", 4), ("model", 2))
    assert m.size == 8 and m.model_axis == "model" and m.data_axes == ("data",)
    assert str(m) == "data=4,model=2"


def test_every_role_by_name_and_alias():
    m = layouts.parse_mesh("data=2,fsdp=2,tp=2,sequence=2,ep=2")
    assert m.roles == (("data", "data"), ("fsdp", "fsdp"), ("tp", "tensor"), ("sequence", "context"), ("ep", "expert"))
    assert m.batch_axes == ("data", "fsdp", "ep") and m.state_axes == ("fsdp",)
    assert m.model_axis == "tp" and m.context_axis == "sequence"


def test_without_an_fsdp_axis_the_data_axes_shard_the_state():
    assert layouts.parse_mesh("data=8").state_axes == ("data",)
    assert layouts.parse_mesh("data=2,fsdp=4").state_axes == ("fsdp",)


@pytest.mark.parametrize("bad", ["", "data", "data=x", "data=0", "data=2,data=2", "8"])
def test_parse_mesh_rejects(bad):
    with pytest.raises(UserError, match="mesh"):
        layouts.parse_mesh(bad)


def test_an_axis_without_a_role_is_refused_with_the_roles_listed():
    with pytest.raises(UserError, match=r"'replica' has no role.*--axis-roles replica=ROLE.*fsdp.*tensor \(alias "
                                        r"model, tp\).*context \(alias sequence, sp, seq\).*expert \(alias ep\)"):
        layouts.parse_mesh("replica=2,data=4")


def test_two_axes_of_one_role_are_refused():
    with pytest.raises(UserError, match="model and tp both have the tensor role"):
        layouts.parse_mesh("model=2,tp=2")


def test_check_layout_needs_the_right_axes():
    with pytest.raises(UserError, match="model axis"):
        layouts.check_layout("tp", layouts.parse_mesh("data=8"))
    with pytest.raises(UserError, match="data axis"):
        layouts.check_layout("fsdp", layouts.parse_mesh("model=8"))
    with pytest.raises(UserError, match="unknown layout"):
        layouts.check_layout("zero7", layouts.parse_mesh("data=8"))


def test_an_fsdp_axis_under_a_layout_that_keeps_the_state_whole_is_refused():
    with pytest.raises(UserError, match=r"--layout dp keeps the state unsharded.*use --layout fsdp"):
        layouts.check_layout("dp", layouts.parse_mesh("fsdp=8"))
    with pytest.raises(UserError, match="use --layout fsdp_tp"):
        layouts.check_layout("tp", layouts.parse_mesh("fsdp=4,tensor=2"))


def test_stage_is_a_layout_axis_for_jaxmems_step_and_a_workloads_own():
    # jaxmem pipelines the layer scan itself (pipeline_stages.py); a custom step keeps its own pipeline
    layouts.check_layout("fsdp", layouts.parse_mesh("fsdp=4,stage=2"))
    layouts.check_layout("fsdp", layouts.parse_mesh("fsdp=4,stage=2"), custom_step=True)


def spec(shape, names, layout, mesh="data=4,model=2", itemsize=4, user=()):
    issues = []
    ms = layouts.parse_mesh(mesh)
    s = rules.leaf_spec("w", shape, itemsize, names, rules.rule_set(layout, ms, user), ms, issues)
    return s, issues


def test_dp_replicates():
    assert spec((1024, 4096), ("embed", "mlp"), "dp")[0] == (None, None)


def test_fsdp_prefers_embed_then_largest_divisible():
    assert spec((1024, 4096), ("embed", "mlp"), "fsdp")[0] == ("data", None)
    assert spec((1024, 4096), None, "fsdp")[0] == (None, "data")
    # 6 is not divisible by 4: the other dim is used
    assert spec((6, 4096), None, "fsdp")[0] == (None, "data")


def test_fsdp_never_splits_the_scan_axis():
    s, _ = spec((32, 4096, 4096), ("layers", "embed", "mlp"), "fsdp", mesh="data=32")
    assert s == (None, "data", None)


def test_tp_is_megatron_by_logical_names():
    assert spec((1024, 4096), ("embed", "mlp"), "tp")[0] == (None, "model")   # column parallel
    assert spec((4096, 1024), ("mlp", "embed"), "tp")[0] == ("model", None)   # row parallel
    assert spec((1024,), ("embed",), "tp")[0] == (None,)


def test_fsdp_tp_uses_both_axes_on_different_dims():
    assert spec((1024, 4096), ("embed", "mlp"), "fsdp_tp")[0] == ("data", "model")


def test_hsdp_shards_the_state_over_fsdp_only():
    assert spec((1024, 4096), ("embed", "mlp"), "fsdp", mesh="data=2,fsdp=4")[0] == ("fsdp", None)
    assert spec((1024, 4096), None, "fsdp", mesh="data=2,fsdp=4")[0] == (None, "fsdp")


def test_expert_weights_split_over_expert_and_their_other_dims_as_usual():
    names = ("layers", "exp", "embed", "mlp")
    assert spec((2, 8, 64, 128), names, "fsdp", mesh="fsdp=2,expert=4")[0] == (None, "expert", "fsdp", None)
    assert spec((2, 8, 64, 128), names, "fsdp_tp", mesh="fsdp=2,expert=2,tensor=2")[0] == (
        None, "expert", "fsdp", "tensor")
    # a dense leaf: the expert axis splits none of its dims
    assert spec((64, 128), ("embed", "mlp"), "fsdp", mesh="fsdp=2,expert=4")[0] == ("fsdp", None)


def test_undivisible_leaf_is_reported_with_its_cost():
    s, issues = spec((129, 131), None, "fsdp", mesh="data=8")
    assert s == (None, None)
    assert len(issues) == 1 and issues[0].replicated_bytes == 129 * 131 * 4 - 129 * 131 * 4 // 8
    # tiny leaves (biases) are replicated by every FSDP implementation: no noise
    assert spec((7,), None, "fsdp", mesh="data=8")[1] == []


def test_a_tensor_dim_that_does_not_divide_is_reported_with_its_cost():
    s, issues = spec((64, 1002), ("embed", "mlp"), "tp", mesh="data=2,model=4")
    assert s == (None, None)
    assert [(i.axis, i.reason, i.replicated_bytes) for i in issues] == [
        ("model", "dim 1 (mlp=1002) not divisible by model=4", 64 * 1002 * 4 - 64 * 1002 * 4 // 4)]


def test_batch_spec_names_the_leaf_that_does_not_divide():
    m = layouts.parse_mesh("data=8")
    assert layouts.batch_spec((64, 3), m, "x") == ("data", None)
    with pytest.raises(UserError, match=r"'tokens'.*12.*multiple of 8"):
        layouts.batch_spec((12, 3), m, "tokens")


def test_the_batch_divides_by_the_axes_that_split_it_and_context_splits_the_sequence():
    m = layouts.parse_mesh("fsdp=4,context=2")
    assert layouts.batch_spec((4, 32), m, "tokens") == ("fsdp", "context")
    assert layouts.batch_spec((4,), m, "labels") == ("fsdp",)
    assert layouts.batch_spec((8, 32), layouts.parse_mesh("data=2,fsdp=2,expert=2,tensor=2"), "t") == (
        ("data", "fsdp", "expert"), None)
    with pytest.raises(UserError, match=r"'tokens' \(4, 30\): its sequence dimension \(dim 1\) 30 is not divisible "
                                        r"by context=4"):
        layouts.batch_spec((4, 30), layouts.parse_mesh("fsdp=4,context=4"), "tokens")


def test_an_axis_of_size_one_splits_nothing_and_is_never_written_into_a_spec():
    assert spec((1024, 4096), ("embed", "mlp"), "fsdp", mesh="data=1")[0] == (None, None)
    assert spec((1024, 4096), None, "fsdp_tp", mesh="data=1,model=1") == ((None, None), [])


def test_a_mesh_of_thousands_of_digits_is_a_user_error():
    with pytest.raises(UserError, match="axis data has 5000 digits of devices"):
        layouts.parse_mesh("data=" + "1" * 5000)


def test_a_mesh_of_stages_only_needs_no_state_axis_for_the_fsdp_layout():
    layouts.check_layout("fsdp", layouts.parse_mesh("stage=2"))   # the stage axis splits the layers' state
    with pytest.raises(UserError, match="needs an fsdp or a data axis"):
        layouts.check_layout("fsdp", layouts.parse_mesh("tensor=2"))


def test_a_layout_beside_a_workloads_own_specs_is_refused():
    mesh = layouts.parse_mesh("fsdp=2,tensor=2")
    layouts.check_layout("fsdp", mesh, custom_step=True, own_specs=True)   # the default: nothing asked
    with pytest.raises(UserError, match="--layout tp: this workload shards its state itself"):
        layouts.check_layout("tp", mesh, custom_step=True, own_specs=True)
