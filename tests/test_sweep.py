"""Sweeps: rows in worker processes (or Ray); a failing or dying row is an error row, the rest is kept."""
import signal

import pytest

from jaxmem.pipeline import AnalyzeOptions
from jaxmem.plan import sweep

DIES = "tests/fixtures/dies.py"


def _job(key, **kw):
    args = tuple(kw.pop("args", {}).items())
    return sweep.Job(key, DIES, AnalyzeOptions(gpu="h100", mesh="data=2", model_args=args, explain=False, **kw))


def test_a_killed_worker_is_a_failed_row_and_the_sweep_finishes(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXMEM_CACHE", str(tmp_path))
    jobs = [_job("ok-8"), _job("killed", args={"die": True}), _job("odd", batch=7), _job("ok-16", batch=16)]
    seen = []
    outs = sweep.run_jobs(jobs, n_jobs=2, progress=False, on_result=lambda o: seen.append(o.job.key))
    assert [o.job for o in outs] == jobs                        # in the order asked, whatever the finishing order
    assert sorted(seen) == sorted(j.key for j in jobs)          # each reported once, as it finished
    by = {o.job.key: o for o in outs}
    assert by["ok-8"].status == by["ok-16"].status == "ok"
    assert by["ok-16"].report.options["batch"] == 16
    assert by["killed"].status == "failed" and by["killed"].report is None
    assert f"killed by {signal.SIGKILL.name}" in by["killed"].error
    assert by["odd"].status == "user_error" and "not divisible" in by["odd"].error


def test_ray_rows_equal_the_local_executors(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("JAXMEM_CACHE", str(tmp_path))
    # compiled twice on purpose (no cache): Ray's rows are its own compiles
    jobs = [_job("b8", cache=False), _job("b16", batch=16, cache=False)]
    local = sweep.run_jobs(jobs, n_jobs=2, progress=False)
    ray_rows = sweep.run_jobs(jobs, n_jobs=2, executor="ray", progress=False)
    assert [o.status for o in ray_rows] == ["ok", "ok"]
    assert [o.report.to_json() for o in ray_rows] == [o.report.to_json() for o in local]


def test_rows_run_from_the_folder_holding_a_clone_named_jaxmem_import_the_installed_package(tmp_path, monkeypatch):
    # `git clone` names the folder jaxmem: seen from its parent it is a namespace package that
    # `python -c` (the workers) would import in place of jaxmem
    import pathlib
    import shutil

    root = pathlib.Path(__file__).resolve().parent.parent
    (tmp_path / "jaxmem" / "models").mkdir(parents=True)
    shutil.copy(root / "models" / "mlp.py", tmp_path / "jaxmem" / "models" / "mlp.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JAXMEM_CACHE", str(tmp_path / "cache"))
    job = sweep.Job("mlp", "jaxmem/models/mlp.py",
                    AnalyzeOptions(gpu="h100", model_args=(("preset", "tiny"),), explain=False))
    (out,) = sweep.run_jobs([job], n_jobs=1, progress=False)
    assert out.status == "ok", out.error


def test_no_module_but_the_runner_drives_the_worker_pools():
    """One runner (issue 53): every planner (compare, the fit searches, advise, the explorer) goes through
    jaxmem.plan.runner; no other module imports the pools' module (jaxmem.plan.sweep) or its private names."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "jaxmem"
    pools = {"LocalPool", "InlinePool", "RayPool", "make_pool", "run_one", "run_jobs", "Progress", "_Worker"}
    offenders = []
    for f in root.rglob("*.py"):
        if f.relative_to(root).as_posix() in ("plan/runner.py", "plan/sweep.py"):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and (
                    node.module == "jaxmem.plan.sweep" or (node.module == "jaxmem.plan" and
                                                          any(a.name == "sweep" for a in node.names))):
                offenders.append(f"{f.relative_to(root)}: imports {node.module}")
            elif isinstance(node, ast.Import) and any(a.name == "jaxmem.plan.sweep" for a in node.names):
                offenders.append(f"{f.relative_to(root)}: imports jaxmem.plan.sweep")
            elif isinstance(node, ast.Attribute) and node.attr in pools and \
                    isinstance(node.value, ast.Name) and node.value.id == "sweep":
                offenders.append(f"{f.relative_to(root)}: sweep.{node.attr}")
    assert offenders == []
