"""Measure a hand-written training step (benchmarks/handwritten/*.py) exactly as jaxmem measures its own.

The parent (:func:`run`) starts a fresh process with the environment of jaxmem's CPU
measurement (:func:`jaxmem.truth.measure.child_env`: the forced host devices,
``MALLOC_MMAP_THRESHOLD_``); the child builds the file's ``train_step_by_hand`` on those
devices, compiled either with XLA's defaults (what the user's ``jax.jit`` gets) or with
the option jaxmem compiles CPU programs with (YNNPACK fusions off,
``jaxmem.compiler.compiled.CPU_COMPILER_OPTIONS``), and measures one step with
:func:`jaxmem.truth.measure.peak_of_one_cpu_run` -- the code that measures jaxmem's step.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path


def run(path: str, args: tuple, n_devices: int, xla_defaults: bool, timeout: float = 600.0) -> dict:
    from jaxmem.truth import measure

    env = measure.child_env(measure.Case(model_file=path, mesh=f"data={n_devices}", backend="cpu"))
    job = {"path": str(path), "args": [list(kv) for kv in args], "xla_defaults": xla_defaults}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve())], input=json.dumps(job), capture_output=True,
                          text=True, env=env, timeout=timeout, check=False)
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            if "error" in result:
                raise measure.MeasureError(result["error"])
            result["wall_s"] = round(time.perf_counter() - t0, 2)
            return result
    tail = "\n".join((proc.stderr or "").strip().splitlines()[-15:])
    raise measure.MeasureError(f"the hand-written step's process exited with {proc.returncode} and no result:\n{tail}")


def _child() -> dict:
    import jax

    from jaxmem.compiler.compiled import CPU_COMPILER_OPTIONS
    from jaxmem.truth import measure

    job = json.loads(sys.stdin.read())
    spec = importlib.util.spec_from_file_location("_handwritten", job["path"])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # flax's dataclass transform looks the module up
    spec.loader.exec_module(mod)
    devices = jax.devices("cpu")
    options = None if job["xla_defaults"] else dict(CPU_COMPILER_OPTIONS)
    compiled, args = mod.train_step_by_hand(devices, compiler_options=options, **dict(job["args"]))
    result = measure.peak_of_one_cpu_run(compiled, args, jax.tree.leaves(args), devices)
    result["xla"] = measure.xla_numbers(compiled)
    result["xla_defaults"] = job["xla_defaults"]
    result["method"] += "; " + measure.compile_note(job["xla_defaults"])
    return result


if __name__ == "__main__":
    try:
        out = _child()
    except Exception as e:  # noqa: BLE001 -- reported to the parent
        import traceback

        out = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"}
    sys.stdout.write("\n" + json.dumps(out) + "\n")
