"""How the `jaxmem` program ends: with the command's exit code, its atexit handlers run, its
output flushed, and without the interpreter's teardown unless another thread is still running."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

FIX = Path(__file__).parent / "fixtures"


def _program(argv: list[str], before: str = "") -> subprocess.CompletedProcess:
    """`jaxmem argv...` as the program runs it (cli.entry), with `before` run first in its process."""
    code = textwrap.dedent(before) + textwrap.dedent(f"""
        import atexit, sys
        atexit.register(lambda: print("atexit ran", flush=True))
        class _Teardown:
            def __del__(self):
                print("teardown ran", flush=True)
        keep = _Teardown()   # freed only by the interpreter's teardown of this module
        sys.argv = ["jaxmem", *{argv!r}]
        from jaxmem.cli import entry
        entry()
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})


def test_the_program_keeps_its_exit_code_runs_atexit_and_skips_the_teardown():
    ok = _program(["analyze", str(FIX / "mlp_small.py"), "--gpu", "cpu", "--json", "--no-cache"])
    assert ok.returncode == 0, ok.stderr
    report, _, rest = ok.stdout.partition("atexit ran")
    # the whole report, flushed, then the atexit handler
    assert json.loads(report)["per_device_peak_bytes"] > 0 and rest.strip() == ""
    assert "teardown ran" not in ok.stdout
    bad = _program(["analyze", "/nonexistent/model.py"])
    assert bad.returncode == 2 and "model file not found" in bad.stderr
    assert "atexit ran" in bad.stdout and "teardown ran" not in bad.stdout


def test_a_thread_still_running_gets_the_normal_exit_which_waits_for_it():
    p = _program(["cache", "--json"], before="""
        import threading, time
        threading.Thread(target=lambda: (time.sleep(1.0), print("thread done", flush=True))).start()
    """)
    assert p.returncode == 0, p.stderr
    assert "thread done" in p.stdout and "atexit ran" in p.stdout
    assert "teardown ran" in p.stdout


def test_tight_exits_0_and_does_not_fit_exits_3():
    """The verdict's exit codes through the program itself: TIGHT (fits at the low end of the runtime's
    estimates, not at the high end) is a fit for scripts; over even at the low end is not."""
    argv = ["analyze", str(FIX / "mlp_small.py"), "--arg", "width=64", "--arg", "batch_size=16", "--gpu", "h100",
            "--mesh", "data=8", "--layout", "dp", "--no-explain", "--json"]
    tight = _program([*argv, "--mem-fraction", "0.98"])
    assert tight.returncode == 0, tight.stderr
    out = json.loads(tight.stdout.partition("atexit ran")[0])
    assert out["verdict"] == "tight" and out["fits"] is True and out["verdict_terms"]
    over = _program([*argv, "--mem-fraction", "0.995"])
    assert over.returncode == 3, over.stderr
    out = json.loads(over.stdout.partition("atexit ran")[0])
    assert out["verdict"] == "does_not_fit" and out["fits"] is False


_HANGUP_CHILD = """
import os, signal, sys, time
from jaxmem import exits, scratch
with scratch.run_scope():
    print("in the scope", flush=True)
    os.kill(os.getpid(), signal.SIGHUP)   # the hang-up lands while the command runs
    time.sleep(0.5)
exits._late_signals_end_the_process()
os.kill(os.getpid(), signal.SIGHUP)       # and again in the teardown
time.sleep(0.2)
print("finished", flush=True)
"""


def _hangup_child(ignored: bool) -> subprocess.CompletedProcess:
    import signal

    def setup():
        signal.signal(signal.SIGHUP, signal.SIG_IGN if ignored else signal.SIG_DFL)
    return subprocess.run([sys.executable, "-c", _HANGUP_CHILD], capture_output=True, text=True, timeout=120,
                          preexec_fn=setup, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})


def test_a_hangup_ignored_at_start_stays_ignored_as_under_nohup():
    """`nohup jaxmem compare ... &`: jaxmem's signal handling must not undo nohup (a hang-up would
    end the sweep); without nohup the same hang-up stops the command."""
    nohup = _hangup_child(ignored=True)
    assert nohup.returncode == 0 and "finished" in nohup.stdout, (nohup.returncode, nohup.stdout, nohup.stderr)
    plain = _hangup_child(ignored=False)
    assert plain.returncode != 0 and "in the scope" in plain.stdout and "finished" not in plain.stdout, \
        (plain.returncode, plain.stdout, plain.stderr)


def test_a_signal_landing_while_the_unraisable_hook_starts_its_thread_does_not_escape_the_hook(monkeypatch):
    """An interrupt swallowed in a gc callback goes to sys.unraisablehook, which starts a thread to raise it
    again in the main thread; Thread.start waits for that thread, and a second signal landing there raised
    out of the hook ("Exception ignored in sys.unraisablehook" and a traceback: a probe saw it on a loaded
    machine). It stays in the hook, armed, and the scope's re-raising thread takes over."""
    import threading
    import types

    from jaxmem.stop import hooks, reraise
    from jaxmem.stop.state import STATE, Interrupted

    def interrupted_start(self):
        raise Interrupted(2)

    started = []
    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    monkeypatch.setattr(reraise, "start", started.append)
    monkeypatch.setitem(STATE, "armed", False)
    monkeypatch.setitem(STATE, "swallowed_in", None)
    u = types.SimpleNamespace(exc_value=Interrupted(2), object=print)
    hooks._unraisable(lambda u: None, u)          # raises nothing
    assert STATE["armed"] is True and started == [2]
