"""Hostile and careless input never gets a wrong verdict, a traceback, or leftovers.

Every probe of tests/probe_cases.py through the CLI: the exit code, no traceback, a message
on stderr naming the culprit, nothing left in TMPDIR (and the probe's own checks). In
process where the probe allows it; in a fresh process for exits, signals, crash-class
sizes and stdout on a full device.
"""
import json

import pytest

import probe_cases as pc


TESTED = [p for p in pc.PROBES if not p.bench_only]
# The classes whose handling does not depend on the jax version (a cache file's bytes, an input's size, where a
# write lands): .ci/run's lowest leg leaves them to the newest leg
ONCE = {"tampered cache", "forged cache (second uid)", "safe writes", "bounded inputs"}


@pytest.mark.parametrize("probe", [pytest.param(p, marks=pytest.mark.once) if p.cls in ONCE else p for p in TESTED],
                         ids=[p.id for p in TESTED])
def test_probe(probe, tmp_path):
    tmp, scratch = tmp_path / "files", tmp_path / "scratch"
    tmp.mkdir()
    scratch.mkdir()
    run = pc.run_in_subprocess if probe.process else pc.run_in_process
    out = run(probe, str(tmp), str(scratch))
    assert not out.problems, f"{probe.id}: {out.problems}\nstdout: {out.stdout[-1500:]}\nstderr: {out.stderr[-1500:]}"


def test_at_least_60_probes_and_unique_names():
    assert len(TESTED) >= 60
    assert len({p.id for p in pc.PROBES}) == len(pc.PROBES)


def test_at_least_150_probes_published_with_every_trust_class_tested():
    """benchmarks/probes.py publishes them all; the suite runs some of each class (the rest are slow)."""
    assert len(pc.PROBES) >= 150
    classes = {"tampered cache", "signals", "killed sweeps", "environment", "option gate"}
    assert {p.cls for p in TESTED} >= classes
    for c in classes:
        assert sum(p.cls == c for p in TESTED) >= 4, c


def test_no_explain_does_not_call_temporaries_gradients(tmp_path):
    """--no-explain cannot split XLA's temp: it stays activations_and_temporaries, with a note (not 0 B of them)."""
    p = pc.Probe("no-explain", ("analyze", pc.MLP, "--gpu", "h100", "--no-explain", "--json"), 0, None)
    out = pc.run_in_process(p, str(tmp_path), str(tmp_path))
    d = json.loads(out.stdout)
    b = d["breakdown"]
    assert b["gradients"] == 0
    assert b["activations_and_temporaries"] == d["xla"]["temp"] > 0
    assert any(w["kind"] == "gradients_not_split" for w in d["warnings"])
    assert sum(b.values()) == d["per_device_peak_bytes"]


def test_module_table_groups_what_has_no_module_and_is_capped():
    from types import SimpleNamespace as M

    from jaxmem.present.render import MODULE_ROWS, module_rows

    mods = [M(module_path=f"(no module: op{i})", bytes=10, buffers=1) for i in range(40)]
    mods += [M(module_path=f"Net/block{i}", bytes=100 + i, buffers=2) for i in range(30)]
    mods += [M(module_path="MLP/Dropout_0/build.<locals>.loss_fn.<locals>.<dictcomp>", bytes=7, buffers=1),
             M(module_path="MLP/Dropout_0", bytes=3, buffers=1)]
    rows, (more, more_bytes) = module_rows(mods)
    names = [r[0] for r in rows]
    assert len(rows) == MODULE_ROWS and names[0] == "(outside any module)" and rows[0][1] == 400
    assert more == 32 - MODULE_ROWS and more_bytes == sum(m.bytes for m in mods) - sum(r[1] for r in rows)
    full, _ = module_rows(mods, limit=None)
    assert ("MLP/Dropout_0", 10, 2) in full and not any("<" in r[0] for r in full)


def test_an_unexpected_error_is_a_one_line_jaxmem_bug_exit_1(monkeypatch):
    from click.testing import CliRunner

    import importlib

    from jaxmem import cli

    def broken(path, opts):
        raise RuntimeError("internal invariant broken\nsecond line")

    monkeypatch.setattr(importlib.import_module("jaxmem.pipeline"), "analyze_file", broken)
    r = CliRunner().invoke(cli.main, ["analyze", pc.TINY, "--gpu", "cpu"])
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("jaxmem bug: RuntimeError: internal invariant broken (") and "second line" not in r.stderr
    assert "JAXMEM_DEBUG=1" in lines[1] and len(lines) == 2 and "Traceback" not in r.output
    r = CliRunner().invoke(cli.main, ["analyze", pc.TINY, "--gpu", "cpu"], env={"JAXMEM_DEBUG": "1"})
    assert isinstance(r.exception, RuntimeError)  # the traceback, for the report


def test_an_axis_named_tp_is_the_model_axis_as_the_readme_says():
    from jaxmem.program import layouts

    for name in ("model", "tensor", "tp"):
        m = layouts.parse_mesh(f"data=2,{name}=2")
        assert m.model_axis == name and m.data_axes == ("data",)


def test_a_process_that_really_survives_the_run_is_reported(tmp_path, monkeypatch):
    """The load-scaled wait still fails a run that leaves a process behind (and kills it after)."""
    monkeypatch.setattr(pc, "ALIVE_S", 0.3)
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
            "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "time.sleep(1.0)")
    p = pc.Probe("survivor", (), 0, None, process=True, argv=("-c", code))
    out = pc.run_in_subprocess(p, str(tmp_path), str(tmp_path))
    assert len(out.alive) == 1   # the sleeper (its command line may still be its parent's, read before its exec)
    assert any("1 process(es) alive" in x for x in out.problems), out.problems
    assert pc.wait_gone([int(out.alive[0].split()[0])], 5.0) == []   # the runner killed it


def test_the_wait_for_a_slow_exit_ends_on_the_exit_not_the_deadline():
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    t0 = time.monotonic()
    assert pc.wait_gone([child.pid], 60.0) == []   # exited (a zombie until reaped: gone)
    assert time.monotonic() - t0 < 30.0
    child.wait()
    survivor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        assert pc.wait_gone([survivor.pid], 0.5) == [survivor.pid]
    finally:
        survivor.kill()
        survivor.wait()
    assert pc.load_factor() >= 1.0
