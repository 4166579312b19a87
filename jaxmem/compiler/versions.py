"""What the installed JAX stack is, and the few jaxlib entry points whose home moved between versions.

jaxmem runs inside the user's own environment (the XLA that decides the memory is the one of
*their* jax), so nothing here is pinned: the supported range is declared (:data:`TESTED`, proven by
CI at both ends, docs/how-it-works.md §1), a jax outside it gets one warning, and what differs between
versions is looked up here once:

* the CUDA plugin (``jax-cuda12-plugin`` or ``jax-cuda13-plugin``) and the CUDA runtime and cuDNN
  versions it was built against, read from the plugin's own ``_versions`` extension without starting
  it (no GPU, no driver): the deviceless target description names them, as a real device would;
* ``HloModule``: ``jaxlib._hlo`` from jaxlib 0.10, ``jaxlib._jax`` before;
* what jaxlib 0.9's XLA reports and dumps differently (:func:`gpu_peak_is_static`,
  :func:`dumps_memory_usage_report`), and how it prints a PartitionSpec (:func:`spec_text`).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from importlib import metadata

import jax
import jaxlib

from jaxmem.report import ReportWarning

try:   # XLA's HloModule binding: jaxlib._hlo from jaxlib 0.10, jaxlib._jax before
    from jaxlib import _hlo as _hlo_binding  # type: ignore[attr-defined]  # an extension module shipped without stubs
except ImportError:   # jaxlib 0.9
    from jax._src.lib import _jax as _hlo_binding

# The jax/jaxlib versions CI runs the suite on at both ends (.ci/run), and the ones between.
TESTED = ((0, 9, 0), (0, 12))           # from 0.9.0 up to every 0.12.x
TESTED_TEXT = "jax/jaxlib 0.9.0 through 0.12.x"
# Where both are installed the CUDA 13 one is named (which one jax loads then was not checked)
PLUGINS = ("jax-cuda13-plugin", "jax-cuda12-plugin")

# What the target description says when no plugin reports its build (only reachable on a GPU
# compile without a plugin, which fails right after with the install hint): the values this
# description was first measured with.
FALLBACK_CUDA = (12, 8, 0)
FALLBACK_CUDNN = (9, 7, 0)


def parse(version: str) -> tuple[int, ...]:
    """'0.12.0.1' -> (0, 12, 0, 1); a suffix such as 'rc1' or '.dev2026' ends the numbers."""
    out = []
    for part in version.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out)


def in_tested_range(version: str) -> bool:
    low, high = TESTED
    v = parse(version)
    return low <= v and v[: len(high)] <= high


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def cuda_plugin() -> tuple[str, str] | None:
    """(distribution, version) of the installed CUDA plugin, or None."""
    for name in PLUGINS:
        v = _dist_version(name)
        if v is not None:
            return name, v
    return None


def _cuda(encoded: int) -> tuple[int, int, int]:
    """CUDA's encoding: 13.0 is 13000, 12.9 is 12090 (major * 1000 + minor * 10)."""
    return encoded // 1000, encoded % 1000 // 10, 0


def _cudnn(encoded: int) -> tuple[int, int, int]:
    """cuDNN's encoding from 9.0 on: 9.12.0 is 91200 (major * 10000 + minor * 100 + patch)."""
    return encoded // 10000, encoded % 10000 // 100, encoded % 100


@functools.cache
def cuda_build() -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
    """(CUDA runtime, cuDNN) versions the installed CUDA plugin was built against, as the plugin's
    ``_versions`` extension reports them without a GPU; None without a plugin that says."""
    plugin = cuda_plugin()
    if plugin is None:
        return None
    module = plugin[0].replace("-", "_")      # jax_cuda13_plugin
    try:
        versions = importlib.import_module(f"{module}._versions")
        return _cuda(int(versions.cuda_runtime_build_version())), _cudnn(int(versions.cudnn_build_version()))
    except Exception:  # noqa: BLE001 -- an old or broken plugin: the caller falls back and says so
        return None


def target_versions() -> tuple[tuple[int, int, int], tuple[int, int, int], str]:
    """(CUDA runtime, cuDNN, where they came from) for the deviceless target description."""
    built = cuda_build()
    if built is not None:
        name, version = cuda_plugin() or ("?", "?")
        return built[0], built[1], f"{name} {version} build"
    return FALLBACK_CUDA, FALLBACK_CUDNN, "no CUDA plugin reported its build: assumed"


def dotted(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def installed() -> dict[str, str]:
    """The versions a report names (JSON ``versions``): Python, jax, jaxlib, flax, optax, qwix where
    installed, the CUDA plugin and the CUDA runtime and cuDNN the GPU target is described with."""

    out = {"python": ".".join(map(str, sys.version_info[:3])), "jax": jax.__version__, "jaxlib": jaxlib.__version__}
    for name in ("flax", "optax", "qwix"):
        v = _dist_version(name)
        if v is not None:
            out[name] = v
    plugin = cuda_plugin()
    if plugin is not None:
        out["cuda_plugin"] = f"{plugin[0]} {plugin[1]}"
        cuda, cudnn, _ = target_versions()
        out["cuda"], out["cudnn"] = dotted(cuda), dotted(cudnn)
    return out


def range_warning() -> str | None:
    """One sentence when the installed jax or jaxlib is outside the tested range, else None."""

    off = [f"{n} {v}" for n, v in (("jax", jax.__version__), ("jaxlib", jaxlib.__version__)) if not in_tested_range(v)]
    if not off:
        return None
    return (f"{' and '.join(off)} is outside the range jaxmem is tested on ({TESTED_TEXT}): the analysis runs, "
            "but XLA internals it reads may have moved; compare a report against a supported jax (jaxmem diff)")


def _jaxlib() -> tuple[int, ...]:
    return parse(jaxlib.__version__)


def gpu_peak_is_static() -> bool:
    """Whether this jaxlib's ``memory_analysis().peak_memory_in_bytes`` of a GPU executable leaves the
    temporaries out. jaxlib 0.9 computes it on a buffer assignment rebuilt from its proto, which keeps
    no heap-simulator trace (as XLA:CPU does on every version): the static memory alone (arguments,
    outputs, constants). From jaxlib 0.10 it is ``ComputePeakMemory`` over the trace, which the decoded
    dump replays exactly (:mod:`jaxmem.xla.timeline`): jaxmem reports that replay where it has the dump."""
    return _jaxlib() < (0, 10)


# The jaxlib minors on which turning XLA:GPU's fusion autotuner off is proven to leave the buffer
# assignment identical (tests/test_compiled.py::test_fast_options_leave_the_buffer_assignment_identical,
# which CI's legs run at 0.10.2 and 0.12.0.1). jaxlib 0.9 does not know the option; on 0.11.2 it leaves
# GEMM fusions without a kernel config ("No supported config found for HLO: %gemm_fusion_dot...", README
# command 1 at bf16), so it is not set there, nor on a minor no test has run it on.
FUSION_AUTOTUNER_OFF_PROVEN = ((0, 10), (0, 12))


def fusion_autotuner_off_proven() -> bool:
    """Whether jaxmem may compile with ``xla_gpu_experimental_enable_fusion_autotuner=false`` on this jaxlib:
    only on a minor whose compile a test proves unchanged by it (:data:`FUSION_AUTOTUNER_OFF_PROVEN`)."""
    return _jaxlib()[:2] in FUSION_AUTOTUNER_OFF_PROVEN


def dumps_memory_usage_report() -> bool:
    """Whether this XLA writes ``*after_optimizations-memory-usage-report.pb`` right after the
    buffer-assigned module (jaxlib 0.10 on; jaxlib 0.9 writes no such report). The early-stopped
    compile takes that file as the sign that the module is written whole; without it, the module's
    own strict parse is the sign (:func:`jaxmem.compiler.early_stop._finished_dump`)."""
    return _jaxlib() >= (0, 10)


def spec_text(spec) -> str:
    """A PartitionSpec (or its entries) as jax 0.10 and later print it, ``P('fsdp', None)``, on every
    jax: jax 0.9 prints ``PartitionSpec('fsdp', None)``. (Specs with unreduced/reduced axes are not
    rendered here.)"""
    return f"P({repr(tuple(spec))[1:-1]})"


def hlo_module_class():
    """XLA's HloModule binding (``jaxlib._hlo`` from jaxlib 0.10, ``jaxlib._jax`` before)."""
    return _hlo_binding.HloModule


def _parser():
    return _hlo_binding.hlo_module_from_text


_UNEXPECTED = re.compile(r'unexpected attribute "(\w+)"')
_MAX_STRIPPED = 8


def hlo_module_from_text(text: str):
    """XLA's HloModule parsed from HLO text. Some XLA versions print attributes their own parser then
    refuses (jaxlib 0.12's all-reduce-start with output_to_operand_aliasing): such an attribute, named
    by the parser's error, is taken out of the text and the parse tried again (nothing jaxmem reads
    from a parsed module, its cost, depends on them); at most a few, then the error stands."""
    parse = _parser()
    for _ in range(_MAX_STRIPPED):
        try:
            return parse(text)
        except Exception as e:   # jaxlib raises its own runtime error type
            m = _UNEXPECTED.search(str(e))
            if m is None:
                raise
            stripped = strip_attribute(text, m.group(1))
            if stripped == text:
                raise
            text = stripped
    return parse(text)


def strip_attribute(text: str, name: str) -> str:
    """`text` without every `, name=<value>` (the value's brackets balanced)."""
    out, i, key = [], 0, f", {name}="
    while (j := text.find(key, i)) >= 0:
        out.append(text[i:j])
        k, depth = j + len(key), 0
        while k < len(text):
            ch = text[k]
            if ch in "{[(":
                depth += 1
            elif ch in "}])":
                if depth == 0:
                    break
                depth -= 1
            elif ch in ",\n" and depth == 0:
                break
            k += 1
        i = k
    out.append(text[i:])
    return "".join(out)


# Flags of XLA_FLAGS that do not reach the compile as given, and why.
_DROPPED = (
    ("--xla_force_host_platform_device_count", "sizes the CPU client's devices only (jaxmem sets it for its CPU work)"),
    ("--xla_dump_", "jaxmem's own dump of the optimized module overrides XLA's dump options (jaxmem.xla.dump)"),
)


def xla_flags(flags: str | None = None) -> dict:
    """The XLA flags in force for a compile: {"passed": [flag, ...], "dropped": {flag: why}}.
    (A flag this XLA does not know never gets here: env.check_xla_flags refuses it, exit 2.)"""

    text = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    passed: list[str] = []
    dropped: dict[str, str] = {}
    for flag in text.split():
        why = next((reason for prefix, reason in _DROPPED if flag.startswith(prefix)), None)
        if why is None:
            passed.append(flag)
        else:
            dropped[flag] = why
    return {"passed": passed, "dropped": dropped}


def summary(versions: dict[str, str], flags: dict) -> str:
    """The text report's last words: 'jax 0.12.0.1 (jaxlib 0.12.0.1, jax-cuda13-plugin 0.12.0.1: CUDA 13.0.0,
    cuDNN 9.12.0), flax 0.12.12; XLA_FLAGS: none'."""
    inner = [f"jaxlib {versions['jaxlib']}"] if "jaxlib" in versions else []
    if "cuda_plugin" in versions:
        inner.append(f"{versions['cuda_plugin']}: CUDA {versions.get('cuda')}, cuDNN {versions.get('cudnn')}")
    head = f"jax {versions.get('jax')}" + (f" ({', '.join(inner)})" if inner else "")
    if versions.get("flax"):
        head += f", flax {versions['flax']}"
    passed = flags.get("passed") or []
    dropped = flags.get("dropped") or {}
    tail = " ".join(passed) if passed else "none"
    if dropped:
        tail += f" ({len(dropped)} left out of the compile: --json xla_flags)"
    return f"{head}; XLA_FLAGS: {tail}"


def check_range() -> list[ReportWarning]:
    """untested_jax: the installed jax or jaxlib outside the tested range."""
    untested = range_warning()
    return [] if untested is None else [ReportWarning("untested_jax", untested)]
