import pytest

from jaxmem.program import layouts
from jaxmem.errors import UserError


def test_parse_mesh_orders_axes_and_finds_roles():
    m = layouts.parse_mesh("data=4, model=2")
    assert m.axes == (("data", 4), ("model", 2))
    assert m.size == 8 and m.model_axis == "model" and m.data_axes == ("data",)
    assert str(m) == "data=4,model=2"


@pytest.mark.parametrize("bad", ["", "data", "data=x", "data=0", "data=2,data=2", "8"])
def test_parse_mesh_rejects(bad):
    with pytest.raises(UserError, match="mesh"):
        layouts.parse_mesh(bad)


def test_check_layout_needs_the_right_axes():
    with pytest.raises(UserError, match="model axis"):
        layouts.check_layout("tp", layouts.parse_mesh("data=8"))
    with pytest.raises(UserError, match="data axis"):
        layouts.check_layout("fsdp", layouts.parse_mesh("model=8"))
    with pytest.raises(UserError, match="unknown layout"):
        layouts.check_layout("zero7", layouts.parse_mesh("data=8"))


def spec(shape, names, layout, mesh="data=4,model=2", itemsize=4):
    issues = []
    s = layouts.leaf_spec("w", shape, itemsize, names, layout, layouts.parse_mesh(mesh), layouts.DEFAULT_TP_RULES, issues)
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


def test_multiple_data_axes_shard_together():
    s, _ = spec((1024, 4096), ("embed", "mlp"), "fsdp", mesh="replica=2,data=4")
    assert s == (("replica", "data"), None)


def test_undivisible_leaf_is_reported_with_its_cost():
    s, issues = spec((129, 131), None, "fsdp", mesh="data=8")
    assert s == (None, None)
    assert len(issues) == 1 and issues[0].replicated_bytes == 129 * 131 * 4 - 129 * 131 * 4 // 8
    # tiny leaves (biases) are replicated by every FSDP implementation: no noise
    assert spec((7,), None, "fsdp", mesh="data=8")[1] == []


def test_batch_spec_names_the_leaf_that_does_not_divide():
    m = layouts.parse_mesh("data=8")
    assert layouts.batch_spec((64, 3), m, "x") == ("data", None)
    with pytest.raises(UserError, match=r"'tokens'.*12.*multiple of 8"):
        layouts.batch_spec((12, 3), m, "tokens")
