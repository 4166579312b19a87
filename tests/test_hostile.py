"""Issue 35's hostile inputs (trust, round three), one test per class: what a user or a hostile
colleague can hand jaxmem, and the one clear answer (exit 2 naming the culprit) each must get.
Each is a promise the probes table (benchmarks/probes.py) can run too."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

from jaxmem import cli

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
MLP = os.path.join(FIX, "mlp_small.py")


def invoke(*args, env=None):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False, env=env)


# ------------------------------------------------------------------ 1. only regular files are written

def _fifo(tmp_path):
    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


def _socket(tmp_path):
    p = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()
    return p


def _link_to_stdout(tmp_path):
    p = tmp_path / "out.png"
    os.symlink("/proc/self/fd/1", p)
    return p


def _link_to_dev_null(tmp_path):
    p = tmp_path / "null.html"
    os.symlink("/dev/null", p)
    return p


def _device_copy(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    p = tmp_path / "null-copy"
    os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))   # a copy of /dev/null
    return p


NODES = [_fifo, _socket, _link_to_stdout, _link_to_dev_null, _device_copy]
OUTPUT_COMMANDS = [
    ("analyze", "--png"), ("analyze", "--html"), ("compare", "--html"), ("compare", "--png"), ("verify", "--html")]


@pytest.mark.parametrize("make", NODES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("command,option", OUTPUT_COMMANDS, ids=lambda x: x)
def test_an_output_aimed_at_a_device_fifo_socket_or_proc_link_is_refused_before_any_work(tmp_path, make, command,
                                                                                          option):
    node = make(tmp_path)
    before = os.lstat(node)
    extra = ("--batches", "8,16") if command == "compare" else ()
    r = invoke(command, MLP, "--gpu", "h100", *extra, option, node)
    assert r.exit_code == 2, r.output
    assert option in r.output and "not a regular file" in r.output, r.output
    after = os.lstat(node)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)   # untouched


@pytest.mark.parametrize("make", NODES, ids=lambda f: f.__name__.strip("_"))
def test_compare_out_aimed_at_a_special_file_is_refused(tmp_path, make):
    node = make(tmp_path)
    if not str(node).endswith(".json"):
        link = tmp_path / "rows.json"
        os.symlink(node, link)
        node = link
    r = invoke("compare", MLP, "--gpu", "h100", "--batches", "8,16", "--out", node)
    assert r.exit_code == 2 and "--out" in r.output and "not a regular file" in r.output, r.output


def test_the_writer_itself_refuses_a_fifo_that_appeared_after_the_check(tmp_path):
    from jaxmem import files

    p = _fifo(tmp_path)
    with pytest.raises(OSError, match="not a regular file"):
        files.write_output(p, b"x", option="--png")
    assert stat.S_ISFIFO(os.lstat(p).st_mode)


def test_a_link_to_a_regular_file_elsewhere_keeps_todays_rule(tmp_path):
    """A link to a regular file is replaced (the link), never written through."""
    from jaxmem import files
    from jaxmem.present import outputs

    target = tmp_path / "target.html"
    target.write_text("theirs")
    link = tmp_path / "page.html"
    os.symlink(target, link)
    outputs.check_all([("--html", str(link))])
    files.write_output(link, b"ours", option="--html")
    assert target.read_text() == "theirs" and link.read_text() == "ours" and not link.is_symlink()


@pytest.mark.parametrize("command,args", [
    ("analyze", ("--html", "{d}/a.html", "--png", "{d}/a.html")),
    ("analyze", ("--html", "{d}/a.html", "--png", "{d}/sub/../a.html")),
    ("compare", ("--batches", "8,16", "--html", "{d}/a.html", "--png", "{d}/a.html")),
    ("compare", ("--batches", "8,16", "--out", "{d}/rows.json", "--html", "{d}/rows.json")),
])
def test_two_outputs_of_one_command_on_the_same_path_are_refused(tmp_path, command, args):
    (tmp_path / "sub").mkdir()
    r = invoke(command, MLP, "--gpu", "h100", *(a.format(d=tmp_path) for a in args))
    assert r.exit_code == 2, r.output
    assert "both write" in r.output, r.output
    assert not (tmp_path / "a.html").exists() and not (tmp_path / "rows.json").exists()


@pytest.mark.parametrize("command,option", [*OUTPUT_COMMANDS, ("compare", "--out")], ids=lambda x: x)
def test_an_empty_output_path_is_refused_naming_the_option(command, option):
    extra = ("--batches", "8,16") if command == "compare" else ()
    r = invoke(command, MLP, "--gpu", "h100", *extra, option, "")
    assert r.exit_code == 2, r.output
    assert f"{option} ''" in r.output, r.output
