"""A local Ray for `--executor ray`: its temporary folder, and the AF_UNIX sockets in it, under a short path.

Ray puts its sockets under its temporary folder (`<temp>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store`,
about 63 bytes of its own), and an AF_UNIX path may not pass 107 bytes on Linux (103 on macOS). By default that
folder is under the process's TMPDIR -- jaxmem's scratch folder (jaxmem.scratch), itself under the user's TMPDIR:
any TMPDIR longer than about 20 characters (macOS's /var/folders/... always) broke Ray's start. So a local Ray
gets a folder of its own, /tmp/jxm-ray-XXXXXXXX (or the first short writable base), whatever TMPDIR is (Ray's
``_temp_dir``, ray.init's documented way to move it), removed when the pool closes; and a Ray that does not start
is the user's error naming the cause (exit 2), never a jaxmem bug.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from typing import Any

from jaxmem.errors import UserError

SOCKET_MAX = 103 if sys.platform == "darwin" else 107   # sun_path's bytes, less its NUL
RAY_TAIL = 72     # bytes Ray adds under its folder: session_2026-12-07_03-51-59_442739_24019/sockets/plasma_store
BASES = ("/tmp", "/var/tmp", "/dev/shm")


def short_temp_dir() -> str:
    """A new folder whose sockets Ray can name: under the first of BASES (then the user's home) short and
    writable enough; a UserError when there is none."""
    for base in (*BASES, os.path.expanduser("~")):
        if len(os.path.realpath(base)) + len("/jxm-ray-XXXXXXXX") + RAY_TAIL > SOCKET_MAX:
            continue
        try:
            return tempfile.mkdtemp(prefix="jxm-ray-", dir=base)
        except OSError:
            continue
    raise UserError(f"--executor ray: Ray's sockets need a folder whose path leaves room within the {SOCKET_MAX} "
                    f"bytes of a socket's name, and none of {', '.join(BASES)} or the home folder is writable and "
                    "short enough; make /tmp writable, or start a Ray cluster (`ray start --head --temp-dir DIR`) "
                    "and give --ray-address")


def init_local(ray: Any, n_cpus: int, runtime_env: dict) -> str:
    """ray.init on this machine with `n_cpus`, its temporary folder a short one of its own (returned: the
    caller removes it after ray.shutdown). A failure to start is a UserError naming Ray's cause."""
    folder = short_temp_dir()
    try:
        ray.init(num_cpus=n_cpus, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env,
                 configure_logging=False, logging_level=logging.ERROR, _temp_dir=folder)
    except Exception as e:  # noqa: BLE001 -- whatever Ray raised, its first line is the cause
        remove(folder)
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise UserError(f"--executor ray: Ray did not start on this machine ({type(e).__name__}: {first}); "
                        "check `ray start --head` here, or use --executor local") from None
    return folder


def remove(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
