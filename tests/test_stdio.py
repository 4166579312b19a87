"""The `jaxmem` program with a closed stdout or stderr (`>&-`, `2>&-`): exit 2 with the message where
it can still be written, never exit 1 (issue 25)."""
import os
import subprocess
import sys

from conftest import ROOT

TINY = str(ROOT / "tests" / "fixtures" / "hostile" / "tiny.py")


def _run(args, close_fd, tmp_path):
    env = {**os.environ, "JAXMEM_CACHE": str(tmp_path / "cache")}
    # the shell's `N>&-`: the child starts with that descriptor closed
    return subprocess.run(["/bin/sh", "-c", f'exec "$0" -m jaxmem.cli "$@" {close_fd}>&-', sys.executable, *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_a_closed_stdout_is_exit_2_said_on_stderr(tmp_path):
    r = _run(["cache"], 1, tmp_path)
    assert r.returncode == 2 and "error: cannot write the output (stdout): stdout is closed" in r.stderr, r.stderr
    assert "jaxmem bug" not in r.stderr and "Traceback" not in r.stderr


def test_a_closed_stderr_keeps_the_exit_code(tmp_path):
    assert _run(["analyze", TINY, "--mesh", "data=0"], 2, tmp_path).returncode == 2
    r = _run(["cache"], 2, tmp_path)
    assert r.returncode == 0 and "entries" in r.stdout


def test_a_file_opened_later_never_takes_stdouts_place(tmp_path):
    """With fd 1 closed, the next open() would get 1 and receive the output; /dev/null holds it."""
    code = ("import os, sys\nfrom jaxmem import stdio\nstdio.guard()\n"
            f"fd = os.open({str(tmp_path / 'f')!r}, os.O_WRONLY | os.O_CREAT)\nprint(fd, file=sys.stderr)\n")
    r = subprocess.run(["/bin/sh", "-c", 'exec "$0" -c "$1" >&-', sys.executable, code], capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and int(r.stderr.strip()) > 2, r.stderr
