"""Probes of "Trust, round two" (issue 25): a shared cache a second user tries to forge, inputs that
could hang or exhaust memory, writes through links, plans without rows, exit 1 for input or
environment, ^C in the Python API, and the smaller items. tests/probe_cases.py runs them.

The second user is real: `useradd` makes one (as root) and the attacker's steps run in a child
process forked from the probe runner with that uid (os.setuid): it can write the shared folder,
never read what the key's mode keeps from it. Without root those probes are skipped.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import hmac
import json
import os
import pathlib
import shutil
import struct
import subprocess
import termios
import threading
import time
import zlib

import probe_trust as pt
from probe_cases import CPU, FIX, TINY, Probe

USER = "jaxmemprobe"
N5000 = "1" * 5000
_state: dict = {}


# -- the second user --------------------------------------------------------------------------------

def second_user() -> tuple[int, int] | None:
    """(uid, gid) of the probe's second user, made once with useradd (None without root)."""
    if "user" not in _state:
        _state["user"] = None
        if os.getuid() == 0:
            import pwd

            try:
                pwd.getpwnam(USER)
            except KeyError:
                subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
                               capture_output=True, check=False)
            try:
                u = pwd.getpwnam(USER)
                _state["user"] = (u.pw_uid, u.pw_gid)
            except KeyError:
                pass
    return _state["user"]


def as_second_user(fn) -> object:
    """fn() in a forked child running as the second user; its return value (JSON) or its error."""
    uid, gid = second_user() or (None, None)
    if uid is None:
        raise RuntimeError("no second user (not root)")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the attacker: no jaxmem, only the files it can reach
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            out = {"ok": fn()}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = {"error": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def _resign_with(key: bytes, header: dict, body: bytes) -> bytes:
    header = {**header, "size": len(body)}
    head = json.dumps({k: v for k, v in header.items() if k != "digest"}, sort_keys=True).encode()
    header["digest"] = hmac.new(key, head + b"\n" + body, hashlib.sha256).hexdigest()
    return gzip.compress(json.dumps(header, sort_keys=True).encode() + b"\n" + body)


def _shared_copy(tmp: str, env: dict, *, group: bool = False) -> pathlib.Path:
    """The golden cache copied into {tmp}/cache, its folders writable by everyone (a shared
    folder: the second user may write it, as the issue's attacker could)."""
    g, _, _ = pt.golden()
    folder = pathlib.Path(tmp, "cache")
    shutil.copytree(g, folder, symlinks=True)
    os.chmod(tmp, 0o777)
    for d in (folder, folder / "compiles"):
        os.chmod(d, 0o2777 if group else 0o777)
    for f in (folder / "compiles").iterdir():
        os.chmod(f, 0o666)
    env["JAXMEM_CACHE"] = str(folder)
    env["XDG_CONFIG_HOME"] = str(pathlib.Path(tmp, "config"))   # this user's trust records: none
    return folder


def _forge(which: str, how: str, *, group: bool = False):
    """The second user replaces the key (how: own | delete | fifo | link) and re-signs entry
    `which` to the opposite verdict with the key now there."""
    def setup(p, tmp, env):
        folder = _shared_copy(tmp, env, group=group)
        _, a, b = pt.golden()
        entry = folder / "compiles" / (a if which == "A" else b)

        def attack():
            key = folder / "secret"
            os.unlink(key)
            if how == "fifo":
                os.mkfifo(key, 0o600)
                return "fifo"
            if how == "link":
                own = pathlib.Path(tmp, "attacker-key")
                own.write_bytes(b"k" * 32)
                os.symlink(own, key)
                mine = b"k" * 32
            elif how == "delete":
                return "deleted"
            else:
                mine = os.urandom(32)
                fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                os.write(fd, mine)
                os.close(fd)
            header, body = pt._split(entry.read_bytes())
            d = json.loads(body)
            d["stats"].update(argument=0, output=0, alias=0, temp=0) if which == "B" else d["stats"].update(
                temp=10**15)
            entry.write_bytes(_resign_with(mine, header, json.dumps(d, separators=(",", ":")).encode()))
            return "forged"

        got = as_second_user(attack)
        assert "ok" in got, got
    return setup


def _exposed_key_read_by_second_user(p, tmp, env):
    """A key left 0644 (as before issue 25): the second user reads it and re-signs A to a petabyte."""
    folder = _shared_copy(tmp, env)
    _, a, _ = pt.golden()
    entry = folder / "compiles" / a
    os.chmod(folder / "secret", 0o644)

    def attack():
        key = (folder / "secret").read_bytes()
        header, body = pt._split(entry.read_bytes())
        d = json.loads(body)
        d["stats"]["temp"] = 10**15
        entry.write_bytes(_resign_with(key, header, json.dumps(d, separators=(",", ":")).encode()))
        return "forged"

    got = as_second_user(attack)
    assert "ok" in got, got


def _key_made_by_a_run(p, tmp, env):
    """An empty shared folder; the probe's run makes the key (checked: the second user cannot read it)."""
    folder = pathlib.Path(tmp, "cache")
    folder.mkdir()
    os.chmod(tmp, 0o777)
    os.chmod(folder, 0o777)
    env["JAXMEM_CACHE"] = str(folder)


def _group_folder(p, tmp, env):
    folder = pathlib.Path(tmp, "cache")
    folder.mkdir()
    os.chmod(folder, 0o2770)
    env["JAXMEM_CACHE"] = str(folder)


def _readonly_damaged(p, tmp, env):
    folder = pathlib.Path(tmp, "cache")
    shutil.copytree(pt.golden()[0], folder, symlinks=True)
    _, a, _ = pt.golden()
    entry = folder / "compiles" / a
    entry.write_bytes(entry.read_bytes()[:100])
    env.update(JAXMEM_CACHE=str(folder), JAXMEM_CACHE_READONLY="1")
    _state[("before", tmp)] = _tree(folder)


def _readonly_empty(p, tmp, env):
    env.update(JAXMEM_CACHE=str(pathlib.Path(tmp, "cache")), JAXMEM_CACHE_READONLY="1")


def _tree(folder: pathlib.Path) -> dict:
    return {str(q.relative_to(folder)): (q.read_bytes() if q.is_file() else None) for q in sorted(folder.rglob("*"))}


def _bomb_entry(p, tmp, env):
    """A's entry replaced by a gzip bomb: 8 GiB of zeros in about 8 MB."""
    folder = pathlib.Path(tmp, "cache")
    shutil.copytree(pt.golden()[0], folder, symlinks=True)
    _, a, _ = pt.golden()
    # One valid gzip member in about 2 s, not the 23 s of compressing 8 GiB: after a full flush the
    # compressor starts afresh, so every further 16 MiB block compresses to the same bytes; the trailer's
    # CRC and size are those of the whole 8 GiB (zlib reads it to the end and finds it sound).
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 24)
    first = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    last = c.compress(block) + c.flush()
    crc = 0
    for _ in range(512):
        crc = zlib.crc32(block, crc)
    with open(folder / "compiles" / a, "wb") as f:
        f.write(first + again * 510 + last[:-8] + struct.pack("<II", crc, (512 << 24) & 0xFFFFFFFF))
    env["JAXMEM_CACHE"] = str(folder)


def _link_entry(p, tmp, env):
    """A's entry is a link to a file of the user's: the run's fresh entry replaces the link."""
    folder = pathlib.Path(tmp, "cache")
    shutil.copytree(pt.golden()[0], folder, symlinks=True)
    _, a, _ = pt.golden()
    pathlib.Path(tmp, "important.txt").write_text("keep me")
    (folder / "compiles" / a).unlink()
    (folder / "compiles" / a).symlink_to(pathlib.Path(tmp, "important.txt"))
    env["JAXMEM_CACHE"] = str(folder)


def _link_key(p, tmp, env):
    folder = pathlib.Path(tmp, "cache")
    shutil.copytree(pt.golden()[0], folder, symlinks=True)
    pathlib.Path(tmp, "important.txt").write_text("keep me")
    (folder / "secret").unlink()
    (folder / "secret").symlink_to(pathlib.Path(tmp, "important.txt"))
    env["JAXMEM_CACHE"] = str(folder)


# -- inputs that could hang or exhaust memory --------------------------------------------------------

def _fifo_with_writer(name: str):
    """{tmp}/NAME a FIFO that a writer keeps full: whatever jaxmem read from it is counted."""
    def setup(p, tmp, env):
        path = pathlib.Path(tmp, name)
        os.mkfifo(path)
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)   # holds it open: a reader's open never waits on us
        written = [0]
        stop = threading.Event()

        def feed():
            chunk = b"[" * 65536
            while not stop.is_set():
                try:
                    written[0] += os.write(fd, chunk)
                except BlockingIOError:
                    time.sleep(0.01)

        t = threading.Thread(target=feed, daemon=True)
        t.start()
        env["JAXMEM_CALIBRATION" if name == "cal-fifo" else "PROBE_FIFO"] = str(path)

        def teardown():
            stop.set()
            t.join()
            left = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
            _state[("read", tmp)] = written[0] - int.from_bytes(left, "little")
            os.close(fd)
        return teardown
    return setup


def _sparse(name: str, size: int):
    def setup(p, tmp, env):
        with open(pathlib.Path(tmp, name), "wb") as f:
            f.truncate(size)
        if name.startswith("cal"):
            env["JAXMEM_CALIBRATION"] = str(pathlib.Path(tmp, name))
    return setup


def _file(name: str, data: bytes, *, calibration: bool = False):
    def setup(p, tmp, env):
        pathlib.Path(tmp, name).write_bytes(data)
        if calibration:
            env["JAXMEM_CALIBRATION"] = str(pathlib.Path(tmp, name))
    return setup


def _alias_bomb() -> bytes:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("logical_axis_rules: [[mlp, *a9]]")
    return ("\n".join(lines) + "\n").encode()


# -- writes through links ------------------------------------------------------------------------------

def _saved_rows() -> bytes:
    """A comparison saved by compare --json (two h100 rows; once per session)."""
    if "rows" not in _state:
        r = pt._jaxmem(("compare", TINY, "--gpu", "h100", "--batches", "8,16", "--jobs", "1", "--json"),
                       pt._session_dir() / "rows-cache")
        assert r.returncode == 0, r.stderr[-2000:]
        _state["rows"] = r.stdout.encode()
    return _state["rows"]


def _link_to_important(name: str, *, rows: bool = False, dangling: bool = False):
    def setup(p, tmp, env):
        target = pathlib.Path(tmp, "important.txt")
        if not dangling:
            target.write_text("keep me")
        pathlib.Path(tmp, name).symlink_to(target)
        if rows:
            pathlib.Path(tmp, "rows.json").write_bytes(_saved_rows())
    return setup


def _rows_file(edit):
    def setup(p, tmp, env):
        rows = json.loads(_saved_rows())
        pathlib.Path(tmp, "rows.json").write_text(json.dumps(edit(rows)))
    return setup


def _rows(p, tmp, env):
    pathlib.Path(tmp, "rows.json").write_bytes(_saved_rows())


pt.SETUPS.update({
    "uid2 own key, B forged to fit": _forge("B", "own"),
    "uid2 own key, A forged to 1 PB": _forge("A", "own"),
    "uid2 own key in a group folder, B forged": _forge("B", "own", group=True),
    "uid2 deletes the key": _forge("A", "delete"),
    "uid2 key is a FIFO": _forge("A", "fifo"),
    "uid2 key is a link to its own": _forge("B", "link"),
    "uid2 reads a 0644 key, A forged": _exposed_key_read_by_second_user,
    "run makes the key": _key_made_by_a_run,
    "group folder": _group_folder,
    "read-only, A damaged": _readonly_damaged,
    "read-only, empty": _readonly_empty,
    "A is a gzip bomb": _bomb_entry,
    "A links to a user file": _link_entry,
    "key links to a user file": _link_key,
    "rules fifo": _fifo_with_writer("fifo"),
    "from fifo": _fifo_with_writer("fifo"),
    "cal fifo": _fifo_with_writer("cal-fifo"),
    "rules sparse 1 TB": _sparse("rules.json", 1 << 40),
    "from sparse 1 TB": _sparse("rows.json", 1 << 40),
    "cal sparse 1 TB": _sparse("cal.json", 1 << 40),
    "rules 17 MiB": _file("rules.json", b" " * (17 << 20) + b"[]"),
    "from 300 MiB": _sparse("rows.json", 300 << 20),
    "cal 2 MiB": _file("cal.json", b" " * (2 << 20) + b"{}", calibration=True),
    "rules deep json": _file("rules.json", b"[" * 100_000 + b"]" * 100_000),
    "rules deep yaml": _file("rules.yaml", b"- " * 5000 + b"x\n"),
    "rules 150 deep": _file("rules.json", b"[" * 150 + b"]" * 150),
    "from deep": _file("rows.json", b"[" * 100_000 + b"]" * 100_000),
    "cal deep": _file("cal.json", b'{"cpu": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", calibration=True),
    "rules huge int json": _file("rules.json", b'[["mlp", ' + N5000.encode() + b"]]"),
    "rules huge int yaml": _file("rules.yaml", b"- [mlp, " + N5000.encode() + b"]\n"),
    "from huge int": _file("rows.json", b"[" + N5000.encode() + b"]"),
    "cal huge int": _file("cal.json", b'{"cpu": {"in_pool_bytes": ' + N5000.encode() + b"}}", calibration=True),
    "rules alias bomb": _file("rules.yaml", _alias_bomb()),
    "rules alias twice": _file("rules.json", b'[["mlp", ["tensor", "model"]]]'),
    "link.json": _link_to_important("link.json", rows=True),
    "link.csv": _link_to_important("link.csv", rows=True),
    "dangling link.json": _link_to_important("link.json", rows=True, dangling=True),
    "link.html": _link_to_important("link.html"),
    "link.png": _link_to_important("link.png"),
    "rows": _rows,
    "rows: none": _rows_file(lambda rows: []),
    "rows: an object": _rows_file(lambda rows: {"rows": rows}),
    "rows: choices only": _rows_file(lambda rows: [{"choice": r["choice"]} for r in rows]),
    "rows: errors only": _rows_file(lambda rows: [{"choice": r["choice"], "report": None, "error": "boom",
                                                   "status": "error"} for r in rows]),
    "rows: null": _rows_file(lambda rows: None),
    "rows: unknown gpu": _rows_file(lambda rows: [{**r, "report": {**r["report"], "target": {
        **r["report"]["target"], "gpu": "v100"}}} for r in rows]),
})


# -- checks (probe_cases.judge calls these for "round2:NAME") -----------------------------------------

def check(name: str, p: Probe, out, tmp: str) -> list[str]:
    folder = pathlib.Path(tmp, "cache")
    if name == "fifo_unread":
        n = _state.pop(("read", tmp), None)
        return [] if n == 0 else [f"{n} bytes read from the FIFO (cap: none may be)"]
    if name == "important_intact":
        t = pathlib.Path(tmp, "important.txt")
        if t.exists() and t.read_text() != "keep me":
            return ["important.txt was written through the link"]
        return []
    if name == "no_target_created":
        return ["the dangling link's target was created"] if pathlib.Path(tmp, "important.txt").exists() else []
    if name == "key_unreadable_by_uid2":
        mode = os.stat(folder / "secret").st_mode & 0o777
        got = as_second_user(lambda: len((folder / "secret").read_bytes()))
        bad = [] if mode == 0o600 else [f"key mode {mode:04o}"]
        return bad + ([] if "error" in got and "Permission" in got["error"] else ["the second user read the key"])
    if name == "key_0640":
        mode = os.stat(folder / "secret").st_mode & 0o777
        return [] if mode == 0o640 else [f"key mode {mode:04o}, not 0640 in a setgid folder"]
    if name == "unchanged_cache":
        before = _state.pop(("before", tmp))
        return [] if _tree(folder) == before else ["a read-only run changed the cache"]
    if name == "no_cache":
        return ["a read-only run made the cache"] if folder.exists() else []
    if name.startswith("rss_below:"):
        limit = int(name.split(":")[1])
        return [] if out.rss_mib is not None and out.rss_mib < limit else [f"peak RSS {out.rss_mib} MiB >= {limit}"]
    raise AssertionError(name)


# -- the probes ----------------------------------------------------------------------------------------

A, B = pt.A, pt.B


def _forged(setup: str, which: str, **kw) -> Probe:
    return Probe(f"uid2: {setup} -> {which} {'fits' if which == 'A' else 'does not fit'}", A if which == "A" else B,
                 0 if which == "A" else 3, kw.pop("message", None), process=True, compiles=True, setup=setup,
                 checks=(f"same_as:{which}", *kw.pop("checks", ())), cls="forged cache (second uid)", bench_only=True,
                 **kw)


FORGED = [
    _forged("uid2 own key, B forged to fit", "B", message="not by you, and you have not trusted it",
            checks=("once:warning: compile cache",)),
    _forged("uid2 own key, A forged to 1 PB", "A", message="jaxmem cache --trust sha256:"),
    _forged("uid2 own key in a group folder, B forged", "B", message="owned by jaxmemprobe"),
    _forged("uid2 deletes the key", "A", checks=("cache_sound:A",)),
    _forged("uid2 key is a FIFO", "A", message="is a FIFO", checks=("fast:120",)),
    _forged("uid2 key is a link to its own", "B", message="is a symbolic link"),
    _forged("uid2 reads a 0644 key, A forged", "A", checks=("cache_sound:A",)),
    Probe("uid2: a key made by a run is 0600, unreadable by uid2", A, 0, None, process=True, compiles=True,
          setup="run makes the key", checks=("round2:key_unreadable_by_uid2",), cls="forged cache (second uid)",
          bench_only=True),
    Probe("jaxmem cache: uid2's key shows its owner and fingerprint, not trusted", ("cache",), 0, None,
          setup="uid2 own key, B forged to fit", checks=("stdout:owner jaxmemprobe", "stdout:fingerprint sha256:",
                                                        "stdout:NOT trusted"), cls="forged cache (second uid)",
          bench_only=True),
    Probe("jaxmem cache --trust a fingerprint not the key's", ("cache", "--trust", "sha256:" + "0" * 32), 2,
          "has the fingerprint sha256:", setup="uid2 own key, B forged to fit", cls="forged cache (second uid)",
          bench_only=True),
    Probe("cache: a setgid folder's key is the group's (0640)", A, 0, None, process=True, compiles=True,
          setup="group folder", checks=("round2:key_0640", "same_as:A"), cls="forged cache (second uid)"),
    Probe("cache read-only: a damaged entry is a miss, nothing written", A, 0, None, process=True, compiles=True,
          setup="read-only, A damaged", checks=("same_as:A", "round2:unchanged_cache"), cls="forged cache (second uid)"),
    Probe("cache read-only: an empty folder stays empty", A, 0, None, process=True, compiles=True,
          setup="read-only, empty", checks=("same_as:A", "round2:no_cache"), cls="forged cache (second uid)"),
    Probe("cache: A is an 8 GiB gzip bomb -> a miss, RSS bounded", A, 0, None, process=True, compiles=True,
          setup="A is a gzip bomb", checks=("same_as:A", "round2:rss_below:1500", "fast:120"),
          cls="forged cache (second uid)"),
    Probe("cache: A links to a user file -> replaced, the file intact", A, 0, None, process=True, compiles=True,
          setup="A links to a user file", checks=("same_as:A", "round2:important_intact", "cache_sound:A"),
          cls="safe writes"),
    Probe("cache: the key links to a user file -> replaced, the file intact", A, 0, None, process=True,
          compiles=True, setup="key links to a user file", checks=("same_as:A", "round2:important_intact"),
          cls="safe writes"),
]

_R = ("analyze", TINY, *CPU)


def _bounded(name, args, setup, message, code=2, checks=(), **kw) -> Probe:
    return Probe(name, args, code, message, setup=setup, checks=("fast:30", *checks), cls="bounded inputs",
                 process=True, **kw)


BOUNDED = [
    _bounded("--rules a FIFO kept full", (*_R, "--rules", "{tmp}/fifo"), "rules fifo", "is a FIFO",
             checks=("round2:fifo_unread",)),
    _bounded("compare --from a FIFO kept full", ("compare", "--from", "{tmp}/fifo"), "from fifo", "is a FIFO",
             checks=("round2:fifo_unread",)),
    _bounded("JAXMEM_CALIBRATION a FIFO kept full", (*_R,), "cal fifo", "is a FIFO", checks=("round2:fifo_unread",)),
    *[_bounded(f"--rules {dev}", (*_R, "--rules", dev), None, "is a device") for dev in ("/dev/zero", "/dev/urandom")],
    *[_bounded(f"compare --from {dev}", ("compare", "--from", dev), None, "is a device")
      for dev in ("/dev/zero", "/dev/urandom")],
    *[Probe(f"JAXMEM_CALIBRATION={dev}", _R, 2, "is a device", env=(("JAXMEM_CALIBRATION", dev),),
            checks=("fast:30",), cls="bounded inputs") for dev in ("/dev/zero", "/dev/urandom")],
    _bounded("--rules a directory", (*_R, "--rules", str(FIX)), None, "is a directory"),
    _bounded("compare --from a directory", ("compare", "--from", str(FIX)), None, "is a directory"),
    Probe("JAXMEM_CALIBRATION a directory", _R, 2, "is a directory", env=(("JAXMEM_CALIBRATION", str(FIX)),),
          cls="bounded inputs"),
    _bounded("--rules a sparse 1 TB file", (*_R, "--rules", "{tmp}/rules.json"), "rules sparse 1 TB",
             "more than the 16,777,216 jaxmem reads"),
    _bounded("compare --from a sparse 1 TB file", ("compare", "--from", "{tmp}/rows.json"), "from sparse 1 TB",
             "more than the 268,435,456 jaxmem reads"),
    _bounded("JAXMEM_CALIBRATION a sparse 1 TB file", _R, "cal sparse 1 TB", "more than the 1,048,576 jaxmem reads"),
    _bounded("--rules 17 MiB", (*_R, "--rules", "{tmp}/rules.json"), "rules 17 MiB", "jaxmem reads"),
    _bounded("compare --from 300 MiB", ("compare", "--from", "{tmp}/rows.json"), "from 300 MiB", "jaxmem reads"),
    _bounded("JAXMEM_CALIBRATION 2 MiB", _R, "cal 2 MiB", "jaxmem reads"),
    _bounded("--rules 100,000 nested lists (JSON)", (*_R, "--rules", "{tmp}/rules.json"), "rules deep json",
             "nested more than 100 levels"),
    _bounded("--rules 5,000 nested lists (YAML)", (*_R, "--rules", "{tmp}/rules.yaml"), "rules deep yaml",
             "nested more than 100 levels"),
    _bounded("--rules 150 nested lists", (*_R, "--rules", "{tmp}/rules.json"), "rules 150 deep",
             "nested more than 100 levels"),
    _bounded("compare --from 100,000 nested lists", ("compare", "--from", "{tmp}/rows.json"), "from deep",
             "nested more than 100 levels"),
    _bounded("JAXMEM_CALIBRATION 100,000 nested lists", _R, "cal deep", "nested more than 100 levels"),
    _bounded("--rules a 5000-digit integer (JSON)", (*_R, "--rules", "{tmp}/rules.json"), "rules huge int json",
             "more than 4300 digits"),
    _bounded("--rules a 5000-digit integer (YAML)", (*_R, "--rules", "{tmp}/rules.yaml"), "rules huge int yaml",
             "a value YAML cannot convert"),
    _bounded("compare --from a 5000-digit integer", ("compare", "--from", "{tmp}/rows.json"), "from huge int",
             "more than 4300 digits"),
    _bounded("JAXMEM_CALIBRATION a 5000-digit integer", _R, "cal huge int", "more than 4300 digits"),
    _bounded("--rules a YAML alias bomb (9^10 values)", (*_R, "--rules", "{tmp}/rules.yaml"), "rules alias bomb",
             "values (YAML aliases expanded)", checks=("round2:rss_below:1500",)),
]

_ROWS = ("compare", "--from", "{tmp}/rows.json")

WRITES = [
    Probe("compare --out link.json -> important.txt", (*_ROWS, "--out", "{tmp}/link.json"), 0, None, setup="link.json",
          checks=("round2:important_intact", "file:link.json"), cls="safe writes", process=True),
    Probe("compare --out link.csv -> important.txt", (*_ROWS, "--out", "{tmp}/link.csv"), 0, None, setup="link.csv",
          checks=("round2:important_intact", "file:link.csv"), cls="safe writes", process=True),
    Probe("compare --out a dangling link: the link replaced", (*_ROWS, "--out", "{tmp}/link.json"), 0, None,
          setup="dangling link.json", checks=("round2:no_target_created", "file:link.json"), cls="safe writes",
          process=True),
    Probe("analyze --html link.html -> important.txt", (*_R, "--html", "{tmp}/link.html"), 0, None,
          setup="link.html", checks=("round2:important_intact", "file:link.html"), cls="safe writes", process=True,
          compiles=True),
    Probe("analyze --png link.png -> important.txt", (*_R, "--png", "{tmp}/link.png"), 0, None, setup="link.png",
          checks=("round2:important_intact", "file:link.png"), cls="safe writes", process=True, compiles=True),
    Probe("compare --out into a missing folder: made, and said", (*_ROWS, "--out", "{tmp}/new/dir/rows.json"), 0,
          "created the folder", setup="rows", checks=("file:new/dir/rows.json",), cls="safe writes", process=True),
    Probe("analyze --html into a missing folder: made, and said", (*_R, "--html", "{tmp}/new/r.html"), 0,
          "created the folder", checks=("file:new/r.html",), cls="safe writes", process=True, compiles=True),
]

NO_VERDICT = [
    Probe(f"compare --from {what}", _ROWS, 2, msg, setup=f"rows: {what}", cls="no verdict from nothing", process=True)
    for what, msg in (("none", "holds no rows"), ("an object", "not a saved comparison"),
                      ("choices only", "no row has an answer"), ("errors only", "no row has an answer"),
                      ("null", "not a saved comparison"), ("unknown gpu", "unknown GPU 'v100'"))
]

_E = "exit 2, not 1"
EXIT2 = [
    Probe("--mesh data=<5000 digits>", ("analyze", TINY, "--mesh", f"data={N5000}"), 2, "axis data has 5000 digits",
          cls=_E, process=True),
    Probe("compare --meshes data=<5000 digits>", ("compare", TINY, "--meshes", f"data=2;data={N5000}"), 2,
          "5000 digits", cls=_E, process=True),
    Probe("advise --mesh data=<5000 digits>", ("advise", TINY, "--mesh", f"data={N5000}"), 2, "5000 digits", cls=_E,
          process=True),
    Probe("verify --mesh data=<5000 digits>", ("verify", TINY, *CPU, "--mesh", f"data={N5000}"), 2, "5000 digits",
          cls=_E, process=True),
    *[Probe(f"{opt} <5000 digits>", ("analyze", TINY, opt, N5000), 2, opt, cls=_E, process=True)
      for opt in ("--batch", "--top", "--accum", "--hosts", "--depth", "--lora")],
    Probe("compare --batches 8,<5000 digits>", ("compare", TINY, "--batches", f"8,{N5000}"), 2, "--batches", cls=_E,
          process=True),
    Probe("--arg hidden=<5000 digits>", ("analyze", TINY, "--arg", f"hidden={N5000}"), 2, "hidden", cls=_E,
          process=True),
    Probe("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB=<5000 digits>", ("analyze", TINY), 2,
          "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", env=(("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", N5000),),
          cls=_E, process=True),
    *[Probe(f"stdout closed (>&-): {' '.join(a[:1])}", a, 2, "cannot write the output (stdout): stdout is closed",
            close_fds=(1,), cls=_E, process=True, compiles=a[0] == "analyze")
      for a in (("cache",), ("gpus",), ("--version",), _R)],
    Probe("stderr closed (2>&-): --mesh data=0", ("analyze", TINY, "--mesh", "data=0"), 2, None, close_fds=(2,),
          cls=_E, process=True),
    Probe("stderr closed (2>&-): a step that fits", _R, 0, None, close_fds=(2,), cls=_E, process=True, compiles=True),
    Probe("stdin closed (<&-): a step that fits", _R, 0, None, close_fds=(0,), cls=_E, process=True, compiles=True),
]

_API = str(FIX / "hostile" / "api_call.py")

API = [
    Probe("API: SIGINT in a gc callback during the option checks", (), 130, "stopped by SIGINT", argv=(_API, "gc"),
          cls="API ^C", process=True),
    Probe("API: SIGINT swallowed, then a made-up diagnosis", (), 130, "stopped by SIGINT", argv=(_API, "swallowed"),
          cls="API ^C", process=True),
    *[Probe(f"API: SIGINT at {f:.0%} of jaxmem.analyze (h100, cache=False)", (), 130, None, argv=(_API, "h100"),
            signal="SIGINT", signal_fraction=f, cls="API ^C", process=True, compiles=True, bench_only=True)
      for f in (0.2, 0.35, 0.5, 0.65, 0.8, 0.9)],
    Probe("API: no signal: a Report", (), 0, None, argv=(_API, "h100"), checks=("stdout:REPORT",), cls="API ^C",
          process=True, compiles=True),
]

SMALL = [
    Probe("--rules alias naming tensor twice", ("analyze", TINY, *CPU, "--mesh", "data=2,tensor=2", "--layout",
                                                "fsdp_tp", "--rules", "{tmp}/rules.json"), 2,
          "names the axis tensor twice", setup="rules alias twice", cls="smaller items"),
    Probe("--mesh stage=2 on a model without a layer scan: the pipeline message", ("analyze", TINY, "--mesh",
                                                                                   "stage=2"), 2,
          "runs no scan over stacked layer weights", cls="smaller items"),
    Probe("--layout tp beside a workload's own specs", ("analyze", str(FIX / "custom_specs.py"), *CPU, "--mesh",
                                                        "fsdp=2,tensor=2", "--layout", "tp"), 2,
          "--layout tp: this workload shards its state itself", cls="smaller items"),
]

# the second-uid probes are the benchmark's (as root: pytest's folders are 0700, out of its reach);
# the user is made when one of them first runs, not when this module is imported
ROUND2 = FORGED + BOUNDED + WRITES + NO_VERDICT + EXIT2 + API + SMALL
