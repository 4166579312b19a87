"""The wheels a GPU machine with its own Python and jax lacks to run jaxmem, built here, offline-ready.

    python benchmarks/gpu_bundle.py DIR [--python-version 3.12]

A typical GPU image already has jax, jaxlib, the CUDA plugin, flax, optax, numpy, click, rich,
matplotlib and nvidia-ml-py, and no network. What jaxmem needs beyond them travels in DIR: jaxmem
itself (a wheel of this checkout) and qwix, each with --no-deps (the image's own jax stack is kept:
no second plugin, no up- or downgrade). Those are pure-Python wheels, so one bundle serves every
Python and platform; the size is checked against the transfer budget (60 MiB), and DIR/MANIFEST.txt
lists each wheel with its size and sha256. On the GPU machine:

    bash benchmarks/gpu_truth.sh --bundle DIR

installs them with ``pip install --no-index --no-deps --target`` and runs its steps there.
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import subprocess
import sys
from importlib import metadata

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUDGET = 60 << 20
# What the GPU image is expected to have (benchmarks/gpu_truth.sh checks them there): not bundled.
PROVIDED = ("jax", "jaxlib", "flax", "optax", "numpy", "click", "rich", "matplotlib", "nvidia-ml-py")
# jaxmem's own requirements beyond PROVIDED, at the version installed here (the one the suite ran with)
EXTRA = ("qwix",)


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, stdout=subprocess.DEVNULL)


def build(out: pathlib.Path) -> list[pathlib.Path]:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    _pip("wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT))
    for name in EXTRA:
        version = metadata.version(name)
        _pip("download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(out), f"{name}=={version}")
    wheels = sorted(out.glob("*.whl"))
    impure = [w.name for w in wheels if not w.name.endswith("-none-any.whl")]
    if impure:
        raise SystemExit(f"gpu_bundle: {impure} are not pure-Python wheels: the bundle would fit one platform only")
    total = sum(w.stat().st_size for w in wheels)
    if total > BUDGET:
        raise SystemExit(f"gpu_bundle: {total:,} B is over the {BUDGET >> 20} MiB budget")
    lines = [f"{w.name}  {w.stat().st_size:,} B  sha256 {hashlib.sha256(w.read_bytes()).hexdigest()}" for w in wheels]
    lines.append(f"total {total:,} B; the GPU machine provides: {', '.join(PROVIDED)}")
    (out / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    return wheels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path, help="the folder to write the wheels into")
    args = ap.parse_args()
    build(args.out)
    print((args.out / "MANIFEST.txt").read_text(), end="")


if __name__ == "__main__":
    main()
