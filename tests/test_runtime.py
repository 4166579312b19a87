"""The runtime model: NCCL communicators counted from the compiled program, terms sized and
sourced, the verdict against how JAX sizes its pool, and calibration files checked on read."""

import json
import os

import pytest
from click.testing import CliRunner
from conftest import build_step

from jaxmem.cli import main
from jaxmem.compiler import calibration, runtime, targets
from jaxmem.errors import UserError
from jaxmem.pipeline import AnalyzeOptions, analyze_file

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
from helpers import MLP_SMALL as MLP  # noqa: E402

LLAMA = ROOT / "models" / "llama.py"
MiB = 1 << 20
EST = calibration.shipped_raw()["cuda_estimates"]


@pytest.fixture(autouse=True)
def no_user_calibration(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXMEM_CALIBRATION", str(tmp_path / "calibration.json"))
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)


def _hlo_and_report(path, mesh, layout, gpu="h100", **args):
    """analyze's report and the optimized HLO of the same program."""
    from jaxmem.compiler import compiled

    rep = analyze_file(str(path), AnalyzeOptions(gpu=gpu, mesh=mesh, layout=layout, explain=False,
                                                 model_args=tuple(args.items())))
    _, built = build_step(path, mesh=mesh, gpu=gpu, layout=layout, model_args=args)
    # the same compile as analyze's (from the compile cache when analyze just stored it)
    return rep, compiled.compile_step(built, explain=False).hlo_text


@pytest.fixture(scope="module")
def dp8():
    return _hlo_and_report(MLP, "data=8", "dp", width=64, batch_size=16)


@pytest.fixture(scope="module")
def fsdp_tp():
    return _hlo_and_report(LLAMA, "data=4,model=2", "fsdp_tp", preset="tiny", batch_size=16)


def _term(rep_or_rt, name):
    terms = rep_or_rt.runtime["terms"] if hasattr(rep_or_rt, "runtime") else [t.to_json() for t in rep_or_rt.terms]
    (t,) = [t for t in terms if t["name"] == name]
    return t


def test_dp_on_data8_needs_one_communicator(dp8):
    rep, hlo = dp8
    assert "all-reduce" in hlo
    nccl = rep.runtime["nccl"]
    assert nccl["communicators_per_device"] == 1
    assert nccl["groups"] == [list(range(8))]   # the gradient all-reduce over every device
    assert nccl["nvls"] is True                 # H100: NVLS on by default
    t = _term(rep, "nccl_communicators")
    assert t["bytes"] == EST["nccl_nvls_communicator_bytes"] and not t["in_pool"] and t["status"] == "estimate"
    assert "openxla/xla#9845" in t["source"]


def test_fsdp_tp_needs_the_groups_its_collectives_use(fsdp_tp, dp8):
    rep, hlo = fsdp_tp
    groups = {frozenset(g) for g in rep.runtime["nccl"]["groups"]}
    # from the compiled HLO, independently of the runtime model: every replica group of 2+ devices
    from jaxmem.xla.collectives import collectives

    colls = collectives(hlo, (("data", 4), ("model", 2)))
    from_hlo = {frozenset(g) for c in colls if c.kind != "collective-permute" for g in c.replica_groups if len(g) > 1}
    if any(c.kind == "collective-permute" and any(len(set(p)) > 1 for p in c.replica_groups) for c in colls):
        from_hlo.add(frozenset(range(8)))
    assert groups == from_hlo
    # device id = data * 2 + model: the model axis pairs (0, 1) and the data axis (0, 2, 4, 6) both carry collectives
    assert frozenset({0, 1}) in groups and frozenset({0, 2, 4, 6}) in groups
    per_device = [sum(d in g for g in groups) for d in range(8)]
    assert rep.runtime["nccl"]["communicators_per_device"] == max(per_device) >= 2
    # the out-of-pool estimate grows accordingly: the busiest device's communicators, each at the NVLS size
    t = _term(rep, "nccl_communicators")
    assert t["bytes"] == max(per_device) * EST["nccl_nvls_communicator_bytes"]
    dp_rep, _ = dp8
    assert rep.runtime["out_of_pool_bytes"] > dp_rep.runtime["out_of_pool_bytes"]
    assert rep.runtime["out_of_pool_bytes"] - dp_rep.runtime["out_of_pool_bytes"] == \
        t["bytes"] - _term(dp_rep, "nccl_communicators")["bytes"]


def test_nvls_only_on_nvswitch_hopper_and_blackwell(fsdp_tp, monkeypatch):
    rep, hlo = fsdp_tp
    axes = (("data", 4), ("model", 2))
    a100 = runtime.model(targets.make_target("a100-80g", 8), hlo, axes)
    groups = [frozenset(g) for g in rep.runtime["nccl"]["groups"]]
    busiest = max(range(8), key=lambda d: sum(
        (EST["nccl_communicator_two_ranks_bytes"] if len(g) == 2 else EST["nccl_communicator_bytes"])
        for g in groups if d in g))
    want = sum(EST["nccl_communicator_two_ranks_bytes"] if len(g) == 2 else EST["nccl_communicator_bytes"]
               for g in groups if busiest in g)
    assert not a100.nvls and _term(a100, "nccl_communicators")["bytes"] == want
    assert "NVIDIA/nccl#964" in _term(a100, "nccl_communicators")["source"]
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    h100_off = runtime.model(targets.make_target("h100", 8), hlo, axes)
    assert not h100_off.nvls and _term(h100_off, "nccl_communicators")["bytes"] == want
    assert "NVLS off" in _term(h100_off, "nccl_communicators")["detail"]


def test_terms_are_named_sourced_and_sum_to_the_breakdown(dp8):
    rep, _ = dp8
    rt = rep.runtime
    names = [t["name"] for t in rt["terms"]]
    assert names == ["allocator", "cuda_context", "nccl_communicators", "cublas_workspace"]
    assert rep.breakdown["runtime_overhead"] == rt["in_pool_bytes"] == sum(t["bytes"] for t in rt["terms"] if t["in_pool"])
    assert rt["out_of_pool_bytes"] == sum(t["bytes"] for t in rt["terms"] if not t["in_pool"])
    for t in rt["terms"]:
        assert t["source"] and t["status"] in ("estimate", "xla")
    # CUDA's defaults: 1 KiB of stack for each of 2048 threads on 132 SMs, + heap, printf FIFO, fixed part
    ctx = _term(rep, "cuda_context")
    assert ctx["bytes"] == 1024 * 2048 * 132 + EST["context_heap_bytes"] + EST["context_printf_fifo_bytes"] + \
        EST["context_fixed_bytes"]
    assert _term(rep, "cublas_workspace")["bytes"] == 0  # already an XLA buffer
    assert json.loads(json.dumps(rep.to_json()))["runtime"] == rt


def test_the_terms_reach_the_terminal_and_the_html(dp8, tmp_path):
    from jaxmem.present import html, render

    rep, _ = dp8
    lines = render.runtime_lines(rep)
    assert lines[0].startswith("runtime per device: 64.00 MiB in JAX's pool (runtime_overhead), 1.67 GiB outside")
    assert [ln.split()[:2] for ln in lines[1:]] == [["in", "pool"], ["outside", "cuda_context"],
                                                   ["outside", "nccl_communicators"], ["in", "pool"]]
    path = tmp_path / "r.html"
    html.write(rep, str(path))
    page = path.read_text()
    assert "<td>nccl_communicators</td><td>outside</td>" in page and "openxla/xla#9845" in page


def test_one_device_has_no_communicator():
    rt = runtime.model(targets.make_target("h100", 1), "", (("data", 1),))
    t = _term(rt, "nccl_communicators")
    assert rt.communicators == 0 and t["bytes"] == 0 and t["status"] == "xla"


def test_preallocated_pool_leaves_room_for_the_out_of_pool_terms(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR", raising=False)
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    t = targets.make_target("h100", 8)
    big = runtime.Runtime((runtime.Term("cuda_context", 10 << 30, False, "x"),))
    b = runtime.budget(t, None, big)
    total = t.memory_bytes
    assert b.usable_bytes == int(total * 0.75) and b.out_of_pool_room == total - int(total * 0.75)
    assert b.out_of_pool_fits                       # 10 GiB fits in the 25% JAX leaves
    b = runtime.budget(t, 0.95, big)
    assert b.usable_bytes == int(total * 0.95) and not b.out_of_pool_fits
    # grown on demand: the pool and the runtime share the card
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    b = runtime.budget(t, 0.95, big)
    assert b.usable_bytes == total - (10 << 30) and b.out_of_pool_fits
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    assert runtime.budget(t, None, big).usable_bytes == total - (10 << 30)


def test_a_fraction_that_starves_nccl_does_not_fit(dp8):
    # 1 NVLS communicator + the context need ~1.7 GiB outside the pool; 0.99 of an H100 leaves 0.8 GiB
    r = CliRunner().invoke(main, ["analyze", str(MLP), "--arg", "width=64", "--arg", "batch_size=16", "--gpu", "h100",
                                  "--mesh", "data=8", "--layout", "dp", "--no-explain", "--mem-fraction", "0.99",
                                  "--json"])
    assert r.exit_code == 3, r.output
    out = json.loads(r.stdout)
    assert out["fits"] is False and out["headroom_bytes"] > 0   # the peak itself fits the pool
    (w,) = [w for w in out["warnings"] if w["kind"] == "runtime_out_of_pool"]
    assert "NCCL" in w["message"] and "at most 0.9" in w["message"]


def test_calibrated_terms_replace_the_estimates(tmp_path, monkeypatch, dp8):
    _, hlo = dp8
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"NVIDIA H100 80GB HBM3": {
        "in_pool_bytes": 3 * MiB, "out_of_pool_bytes": 500 * MiB, "nccl_communicator_bytes": 900 * MiB,
        "source": "measured by `jaxmem calibrate --gpu local` on NVIDIA H100 80GB HBM3", "measured_at": "2026-11-30"}}))
    rt = runtime.model(targets.make_target("h100", 8), hlo, (("data", 8),))
    assert rt.calibrated
    assert [(t.name, t.bytes, t.status) for t in rt.terms[:3]] == [
        ("allocator", 3 * MiB, "measured"), ("cuda_context", 500 * MiB, "measured"),
        ("nccl_communicators", 900 * MiB, "measured")]


# ---------------------------------------------------------------- calibration files


BAD_FILES = {
    "negative": (json.dumps({"cpu": {"in_pool_bytes": -5, "out_of_pool_bytes": 0, "source": "x"}}), "in_pool_bytes"),
    "string": (json.dumps({"cpu": {"in_pool_bytes": "5", "out_of_pool_bytes": 0, "source": "x"}}), "in_pool_bytes"),
    "bool": (json.dumps({"cpu": {"in_pool_bytes": True, "out_of_pool_bytes": 0, "source": "x"}}), "in_pool_bytes"),
    "float": (json.dumps({"cpu": {"in_pool_bytes": 1.5, "out_of_pool_bytes": 0, "source": "x"}}), "in_pool_bytes"),
    "huge": (json.dumps({"cpu": {"in_pool_bytes": 10 ** 20, "out_of_pool_bytes": 0, "source": "x"}}), "in_pool_bytes"),
    "missing": (json.dumps({"cpu": {"in_pool_bytes": 0, "source": "x"}}), "out_of_pool_bytes"),
    "no source": (json.dumps({"cpu": {"in_pool_bytes": 0, "out_of_pool_bytes": 0}}), "source"),
    "list": (json.dumps([1, 2]), "JSON object"),
    "entry list": (json.dumps({"cpu": [1]}), "'cpu'"),
    "not json": ("{not json", "not valid JSON"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_calibration_file_is_an_error_naming_the_file_and_key(name, tmp_path):
    text, culprit = BAD_FILES[name]
    path = tmp_path / "calibration.json"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        calibration.read_user(path)
    assert str(path) in str(e.value) and culprit in str(e.value)


def test_non_utf8_and_directory_calibration_files(tmp_path):
    p = tmp_path / "calibration.json"
    p.write_bytes(b'{"cpu": "\xff\xfe"}')
    with pytest.raises(UserError, match="not UTF-8"):
        calibration.read_user(p)
    d = tmp_path / "dir.json"
    d.mkdir()
    with pytest.raises(UserError, match="is a directory"):
        calibration.read_user(d)


def test_analyze_refuses_a_negative_calibration(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"cpu": {"in_pool_bytes": -(1 << 40), "out_of_pool_bytes": 0, "source": "x"}}))
    r = CliRunner().invoke(main, ["analyze", str(MLP), "--gpu", "cpu", "--no-explain"])
    assert r.exit_code == 2, r.output
    assert str(path) in r.output and "in_pool_bytes" in r.output and "Traceback" not in r.output


def test_calibrate_never_overwrites_an_unreadable_file(tmp_path):
    path = tmp_path / "calibration.json"
    text = '{"NVIDIA H100 80GB HBM3": {"in_pool_bytes": 1, "out_of_pool_bytes": 2, "source": "kept"}, oops'
    path.write_text(text)
    r = CliRunner().invoke(main, ["calibrate", "--gpu", "cpu"])
    assert r.exit_code == 2 and str(path) in r.output
    assert path.read_text() == text


def test_save_is_atomic_and_keeps_other_kinds(tmp_path):
    path = tmp_path / "sub" / "calibration.json"
    a = calibration.Entry(1, 2, "first", "2026-11-30", 0, 7)
    calibration.save(["NVIDIA H100 80GB HBM3"], a, path)
    calibration.save(["cpu"], calibration.Entry(3, 0, "second", None, 10), path)
    got = calibration.read_user(path)
    assert got["NVIDIA H100 80GB HBM3"] == a and got["cpu"].per_process_bytes == 10
    assert os.listdir(path.parent) == ["calibration.json"]   # no temporary file left behind
    with pytest.raises(UserError, match="is a directory"):
        calibration.save(["cpu"], a, tmp_path)


def test_a_group_with_one_device_per_host_has_no_nvls():
    # data=2 over 2 hosts: the gradient all-reduce pairs devices on different hosts (no shared NVSwitch)
    rep = analyze_file(str(MLP), AnalyzeOptions(gpu="h100", mesh="data=2", hosts=2, layout="dp", explain=False,
                                                model_args=(("width", 64), ("batch_size", 16))))
    t = _term(rep, "nccl_communicators")
    assert rep.runtime["nccl"]["groups"] == [[0, 1]] and rep.runtime["nccl"]["nvls"] is False
    assert t["bytes"] == EST["nccl_communicator_two_ranks_bytes"] and "NVIDIA/nccl#964" in t["source"]
    assert "groups span hosts" in t["detail"]
