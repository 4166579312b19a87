"""Reading the files a user names, and writing the files jaxmem writes: one way for every caller.

Reads (rules files, saved plans, calibration files, cache entries) are bounded and never block:
only a regular file is read (a FIFO, a device, a directory or a socket is refused at once, as the
model file is), opened with O_NONBLOCK (opening a FIFO waits for no writer) and checked with fstat
before a byte is read; at most a cap of bytes is read, whatever the file's size claims (/proc files
say 0); JSON and YAML documents nest at most MAX_DEPTH deep and expand to at most MAX_NODES
values (a YAML alias bomb). A refusal is a UserError naming the file, what it is, and the fix.

Writes (--out, --html, --png, the cache, the calibration file) go to a temporary file beside the
target, flushed, then renamed over it: a reader sees the old file or the new one, never part of
one, and a target that is a symbolic link is replaced (the link), never written through onto the
file it points at.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import sys
from collections.abc import Callable
from itertools import chain, compress, repeat
from operator import is_, not_
from pathlib import Path

from jaxmem.errors import UserError

MAX_DEPTH = 100          # a rules file nests 3 deep, a saved comparison about 10
MAX_NODES = 10_000_000   # values a parsed document may hold once YAML aliases are expanded
MiB = 1 << 20
_CONTAINERS = (dict, list, tuple)
_CONTAINER_TYPES = frozenset(_CONTAINERS)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


class Refused(Exception):
    """Why a file was not read (the caller says whose file it is and what to do)."""


def read_regular(path: str | os.PathLike, limit: int, *, follow: bool = True) -> bytes:
    """The bytes of `path` if it is a regular file of at most `limit` bytes; else Refused (the
    reason) or OSError (it cannot be opened). `follow=False`: a symbolic link is refused too."""
    return read_regular_stat(path, limit, follow=follow)[0]


def read_regular_stat(path: str | os.PathLike, limit: int, *, follow: bool = True) -> tuple[bytes, os.stat_result]:
    """read_regular, and the fstat of the very file read (its owner and mode, without a race)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow and os.path.islink(path):
            raise Refused("a symbolic link") from None
        if os.path.isdir(path):   # some systems refuse O_RDONLY on a directory outright
            raise Refused("a directory") from None
        raise e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(_kind(st.st_mode))
        if st.st_size > limit:
            raise Refused(f"{st.st_size:,} bytes, more than the {limit:,} jaxmem reads")
        data = bytearray()
        while True:   # never more than limit + 1 bytes, whatever the size said
            chunk = os.read(fd, min(MiB, limit + 1 - len(data)))
            if not chunk:
                return bytes(data), st
            data += chunk
            if len(data) > limit:
                raise Refused(f"more than the {limit:,} bytes jaxmem reads")
    finally:
        os.close(fd)


def read_user_file(path: str | os.PathLike, limit: int, what: str, fix: str) -> bytes:
    """read_regular for a file the user named: any refusal or OSError is a UserError
    `<what> <path>: <why>; <fix>`."""
    try:
        return read_regular(path, limit)
    except Refused as e:
        raise UserError(f"{what} {path}: is {e}, not a file jaxmem reads; {fix}") from None
    except OSError as e:
        raise UserError(f"{what} {path}: cannot read it ({e.strerror or e}); {fix}") from None


def check_tree(doc, what: str, *, each_level: Callable[[list], None] | None = None, text_keys: bool = False) -> None:
    """A parsed document nests at most MAX_DEPTH deep and holds at most MAX_NODES values (counted
    as expanded: a YAML alias counts each time it is used). UserError naming `what` otherwise.
    Iterative: the check itself cannot overflow the stack.

    The walk goes a level at a time in C's loops (map, chain, compress), not a Python step per
    value: a 300,000-row report in a fraction of a second. `each_level` is given the values each
    level holds (dicts' values, lists' and tuples' items), so a caller checks them in the same
    walk. `text_keys`: every dict key is text (JSON), none a container (YAML's complex keys)."""
    nodes = 1
    depth = 0
    level = [doc] if type(doc) in _CONTAINERS else []
    while level:   # a level's values counted before they are gathered: an alias bomb stops here
        if depth + 1 > MAX_DEPTH and any(level):   # a non-empty container this deep
            raise UserError(f"{what}: nested more than {MAX_DEPTH} levels deep; no file jaxmem reads nests so")
        is_dict = list(map(is_, map(type, level), repeat(dict)))
        dicts = list(compress(level, is_dict))
        seqs = list(compress(level, map(not_, is_dict))) if len(dicts) < len(level) else []
        nodes += 2 * sum(map(len, dicts)) + sum(map(len, seqs))   # a dict's keys and values count
        if nodes > MAX_NODES:
            raise UserError(f"{what}: more than {MAX_NODES:,} values (YAML aliases expanded); not a file jaxmem "
                            "writes or reads")
        values = list(chain(chain.from_iterable(map(dict.values, dicts)), chain.from_iterable(seqs)))
        if each_level is not None:
            each_level(values)
        level = list(compress(values, map(_CONTAINER_TYPES.__contains__, map(type, values))))
        if not text_keys and tuple in set(map(type, chain.from_iterable(dicts))):
            level += [k for k in chain.from_iterable(dicts) if type(k) is tuple]
        depth += 1


def loads_json(text: str | bytes, what: str, *, each_level: Callable[[list], None] | None = None):
    """json.loads, its nesting and its numbers bounded: a document nested past Python's recursion
    limit, or a number of more digits than Python converts (4300), is a UserError naming `what`;
    a document that is not JSON raises ValueError (the caller's message: it may try YAML).
    `each_level`: as check_tree's."""

    try:
        doc = json.loads(text)
    except RecursionError:
        raise UserError(f"{what}: nested more than {MAX_DEPTH} levels deep; no file jaxmem reads nests so") from None
    except ValueError as e:
        if "Exceeds the limit" in str(e) or "digits" in str(e):
            raise UserError(f"{what}: holds an integer of more than 4300 digits; no value jaxmem reads is that "
                            "large") from None
        raise
    if each_level is not None or not text_within_bounds(text):
        check_tree(doc, what, each_level=each_level, text_keys=True)
    return doc


_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}"')))   # all bytes but brackets and quotes


def text_within_bounds(text: str | bytes) -> bool:
    """Whether a JSON text that parsed (in UTF-8) nests at most MAX_DEPTH deep and holds at most
    MAX_NODES values, read from its bytes in C's loops: a 50 MB report in a fifth of a second, a
    third of check_tree's walk. False: it may not, or the text cannot tell (a str, another encoding,
    an escaped quote, a bracket within a string): check_tree decides.

    Values: a dict of k entries is written with k colons, k - 1 commas and a brace (2k, as
    check_tree counts it), a list of k items with k - 1 commas and a bracket; those within strings
    only add. Depth: with no escaped quote every quote bounds a string, so once the other bytes are
    dropped a string holding no bracket is a pair of quotes; what is left is the brackets, and each
    replace of "[]" (or "{}") by nothing removes at most one level (from every chain of them)."""
    if not isinstance(text, bytes) or json.detect_encoding(text) not in ("utf-8", "utf-8-sig") or b'\\"' in text:
        return False
    if 1 + sum(map(text.count, (b",", b":", b"[", b"{"))) > MAX_NODES:
        return False
    brackets = text.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in brackets:   # a quote left: a string holds a bracket
        return False
    levels = 0   # replaces that removed something: the nesting is at most this deep once nothing is left
    while brackets:
        before = len(brackets)
        for pair in (b"[]", b"{}"):
            shorter = brackets.replace(pair, b"")
            levels += len(shorter) < len(brackets)
            brackets = shorter
        if levels > MAX_DEPTH or len(brackets) == before:
            return False
    return True


# -------------------------------------------------------------------------------------------- writes

def _temp_beside(path: Path) -> tuple[int, Path]:
    # ".tmp-" first: `jaxmem cache` counts (and --clear removes) what a killed writer left
    tmp = path.parent / f".tmp-{os.getpid()}-{secrets.token_hex(6)}-{path.name}"[:255]
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    return os.open(tmp, flags, 0o666), tmp   # 0o666 less the umask, as any file the user writes


def write_atomic(path: str | os.PathLike, data: bytes | Callable[[int], None], *, mode: int | None = None,
                 fsync: bool = True) -> None:
    """Write `data` (bytes, or a function writing to a file descriptor) to a temporary file beside
    `path`, flush it, and rename it over `path`. A `path` that is a symbolic link is replaced (the
    link), never followed. `mode`: the file's permission bits (chmod'ed before the rename: a key
    is never readable by others, even for a moment). Raises OSError; the temporary file never
    survives a failure."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            if callable(data):
                data(fd)
            else:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# a link into these is a link to a device, a process's descriptor or a kernel setting, never a file to replace
_SPECIAL_TREES = ("/dev", "/proc", "/sys")


def special_kind(path: str | os.PathLike) -> str | None:
    """What makes `path` no place for a regular file, or None: an existing non-regular file (a device,
    a FIFO, a socket), or a symbolic link into /dev, /proc or /sys (its target may not exist yet:
    /proc/self/fd/1 read from another process)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        hop = os.path.abspath(path)
        for _ in range(40):   # each link of a chain, as written: /proc/self/fd/1 resolves per process
            if not os.path.islink(hop):
                break
            hop = os.path.normpath(os.path.join(os.path.dirname(hop), os.readlink(hop)))
            for tree in _SPECIAL_TREES:
                if hop == tree or hop.startswith(tree + "/"):
                    return f"a link into {tree}"
        resolved = os.path.realpath(path)
        if any(resolved == t or resolved.startswith(t + "/") for t in _SPECIAL_TREES):
            return f"a link into {next(t for t in _SPECIAL_TREES if resolved == t or resolved.startswith(t + '/'))}"
        try:
            st = os.stat(path)
        except OSError:
            return None   # a dangling link elsewhere: replaced, as today
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    return _kind(st.st_mode)


def _note(line: str) -> None:
    if sys.stderr is not None:
        sys.stderr.write(f"note: {line}\n")


def write_output(path: str | os.PathLike, data: bytes, *, option: str,
                 on_note: Callable[[str], None] = _note) -> None:
    """A user-named output (--out, --html, --png): its missing parent folders created (and said
    so, on stderr), then write_atomic. OSError is the caller's to report."""
    special = special_kind(path)
    if special:   # checked before the work too (jaxmem.present.outputs): here in case it appeared since
        raise OSError(errno.EEXIST, f"is {special}, not a regular file; jaxmem writes only regular files")
    parent = Path(os.path.abspath(path)).parent
    if not parent.is_dir():
        parent.mkdir(parents=True, exist_ok=True)
        on_note(f"{option} {path}: created the folder {parent}")
    write_atomic(path, data, fsync=False)
