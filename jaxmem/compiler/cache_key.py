"""The compile cache's signing key, and whose it is: who can sign (so forge) an entry.

Every entry is signed with ``<cache>/secret`` (HMAC-SHA256, jaxmem.compiler.cache); whoever can
read the key can sign an entry that passes. So the key is trusted only when no one but its
holders could have read or replaced it:

* it is a regular file of 32 bytes, readable by no other user (no "other" bits) and writable by
  no group: created 0600, or 0640 in a folder shared through its group (the setgid bit set: the
  key is then the group's, and so is forging);
* and it is this user's (their uid owns it: a user who can only write the folder may delete the
  key and put their own there, but it is then theirs, not ours), or its fingerprint is one this
  user trusted for this cache (``jaxmem cache --trust FINGERPRINT``: a team member's key, in the
  user's own ``$XDG_CONFIG_HOME/jaxmem/trusted-cache-keys.json``).

A key that is not trusted is never used: its entries are misses, nothing is stored under it, and
one warning per process says why and what to do. A key of this user's own that is damaged or that
others could read (a 0644 key of jaxmem 0.x) is replaced by a new one: its entries compile once
more. ``JAXMEM_CACHE_READONLY=1``: a reader that never writes (no key made, no entry stored or
removed) -- for a folder the team's readers may read but not write.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import stat
import sys
from pathlib import Path

from jaxmem import files
from jaxmem.errors import UserError

KEY_BYTES = 32
_warned: set[str] = set()


def read_only() -> bool:
    return os.environ.get("JAXMEM_CACHE_READONLY", "").strip().lower() not in ("", "0", "false", "no")


def fingerprint(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:32]


def _who(uid: int) -> str:
    name = _owner(uid)
    return name if name.startswith("uid ") else f"{name} (uid {uid})"


def _owner(uid: int) -> str:
    try:
        import pwd  # noqa: PLC0415 - Unix only

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


@dataclasses.dataclass
class Key:
    path: Path
    state: str                  # "missing" | "damaged" | "exposed" | "foreign" | "replaced" | "trusted"
    why: str                    # how it is trusted, or why not
    data: bytes | None = None   # set only when trusted
    owner_uid: int | None = None
    mode: int | None = None
    fingerprint: str | None = None

    @property
    def trusted(self) -> bool:
        return self.state == "trusted"

    @property
    def mine(self) -> bool:
        return self.owner_uid == os.getuid()

    def to_json(self) -> dict:
        return {"path": str(self.path), "state": self.state, "trusted": self.trusted, "why": self.why,
                "owner_uid": self.owner_uid, "owner": None if self.owner_uid is None else _owner(self.owner_uid),
                "mode": None if self.mode is None else f"{self.mode:04o}", "fingerprint": self.fingerprint,
                "read_only": read_only()}


def trust_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base, "jaxmem", "trusted-cache-keys.json")


def _trust_records() -> dict:
    try:
        d = files.loads_json(files.read_regular(trust_file(), 1 << 20), str(trust_file()))
    except (OSError, files.Refused, ValueError, UserError):
        return {}
    return d if isinstance(d, dict) else {}


def _trusted(cache: Path) -> list[str]:
    fps = _trust_records().get(str(cache.resolve()), [])
    return [f for f in fps if isinstance(f, str)] if isinstance(fps, list) else []


def inspect(cache: Path) -> Key:
    """The key of the cache at `cache`, read (never made) and judged (the module's docstring)."""
    path = cache / "secret"
    if not os.path.lexists(path):
        return Key(path, "missing", "there is no key yet (the first compile stored makes one)")
    try:
        data, st = files.read_regular_stat(path, KEY_BYTES + 1, follow=False)
    except files.Refused as e:
        return Key(path, "damaged", f"is {e}, not a key", owner_uid=_lstat_uid(path))
    except OSError as e:
        return Key(path, "foreign" if e.errno in (1, 13) else "damaged", f"cannot be read ({e.strerror or e})",
                   owner_uid=_lstat_uid(path))
    uid, mode = st.st_uid, stat.S_IMODE(st.st_mode)
    if len(data) != KEY_BYTES:
        return Key(path, "damaged", f"is {len(data)} bytes, not a {KEY_BYTES}-byte key", owner_uid=uid, mode=mode)
    fp = fingerprint(data)
    k = Key(path, "trusted", "", owner_uid=uid, mode=mode, fingerprint=fp)
    if mode & 0o007:
        k.state, k.why = "exposed", (f"is readable by every user of this machine (mode {mode:04o}): anyone could "
                                     "have read it and signed a forged entry")
    elif mode & 0o020:
        k.state, k.why = "exposed", f"is writable by its group (mode {mode:04o})"
    elif uid == os.getuid():
        k.why = "yours"
    else:
        trusted = _trusted(cache)
        if fp in trusted:
            k.why = f"{_owner(uid)}'s, trusted by you (jaxmem cache --trust)"
        elif trusted:
            k.state, k.why = "replaced", (f"is not the key you trusted for this cache ({', '.join(trusted)}): "
                                          f"it was replaced, by {_who(uid)}")
        else:
            k.state, k.why = "foreign", (f"is owned by {_who(uid)}, not by you, and you have not "
                                         "trusted it")
    if k.trusted:
        k.data = data
    return k


def _lstat_uid(path: Path) -> int | None:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


def _warn(cache: Path, k: Key) -> None:
    if str(cache) in _warned or sys.stderr is None:
        return
    _warned.add(str(cache))
    if k.state in ("foreign", "replaced"):
        fix = (f"If your team shares this cache and {k.fingerprint or 'its key'} is its key, `jaxmem cache --trust "
               f"{k.fingerprint or 'FINGERPRINT'}` trusts it; else point JAXMEM_CACHE at a folder of your own")
    elif k.state == "exposed":
        fix = f"Its owner ({_owner(k.owner_uid or 0)}) can remove it, or point JAXMEM_CACHE elsewhere"
    else:
        fix = "Remove it (a new one is made), or point JAXMEM_CACHE elsewhere"
    try:
        sys.stderr.write(f"warning: compile cache {cache}: its key {k.path} {k.why}; its entries are not used "
                         f"and nothing is stored (every analysis compiles). {fix}.\n")
    except (OSError, ValueError):
        pass


def for_use(cache: Path, *, create: bool) -> bytes | None:
    """The key to verify (and, with `create`, sign) entries with: a trusted one; with `create` (a
    store, not in read-only mode) a new one where there is none, or where this user's own is
    damaged or exposed. None otherwise, with the one warning saying why (no warning for a cache
    that has no key yet)."""
    k = inspect(cache)
    if k.trusted:
        return k.data
    writer = create and not read_only()
    if k.state == "missing":
        return _create(cache, replace=False) if writer else None
    ours = k.state in ("damaged", "exposed") and (k.owner_uid is None or k.mine)
    if ours and writer:
        return _create(cache, replace=True)   # this user's own, damaged or exposed: a new one
    if ours and not read_only():
        return None   # a miss; the fresh compile's store replaces the key
    _warn(cache, k)
    return None


def _create(cache: Path, *, replace: bool) -> bytes | None:
    """A new key: 0600, or 0640 in a folder shared through its group (setgid). Of concurrent first
    writers the first wins (os.link never replaces); the key read back is used only when trusted."""
    path = cache / "secret"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        mode = 0o640 if os.stat(cache).st_mode & stat.S_ISGID else 0o600
        data = secrets.token_bytes(KEY_BYTES)
        if replace:
            files.write_atomic(path, data, mode=mode)
        else:
            fd, tmp = files._temp_beside(path)
            try:
                os.fchmod(fd, mode)   # before a byte is written: never readable by others
                os.write(fd, data)
                os.fsync(fd)
                os.close(fd)
                os.link(tmp, path)    # never replaces: of concurrent first writers, the first wins
            except FileExistsError:
                pass
            finally:
                if os.path.lexists(tmp):
                    os.unlink(tmp)
    except OSError:
        return None
    k = inspect(cache)
    return k.data if k.trusted else None


def trust(cache: Path, fp: str) -> Key:
    """Record `fp` as a key this user trusts for `cache` (it must be the cache's key now)."""
    k = inspect(cache)
    if k.fingerprint is None:
        raise UserError(f"--trust: the compile cache {cache} has no readable key ({k.path} {k.why})")
    if fp.strip() != k.fingerprint:
        raise UserError(f"--trust {fp}: the key of {cache} has the fingerprint {k.fingerprint} (owned by "
                        f"{_owner(k.owner_uid or 0)}); give that one if you trust it")
    if k.state == "exposed":
        raise UserError(f"--trust: {k.path} {k.why}; a key others can read cannot be trusted")
    records = _trust_records()
    key = str(cache.resolve())
    records[key] = sorted(set(_trusted(cache)) | {fp.strip()})
    path = trust_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(path, (json.dumps(records, indent=2) + "\n").encode(), mode=0o600)
    except OSError as e:
        raise UserError(f"--trust: cannot write {path} ({e.strerror or e})") from None
    return inspect(cache)
