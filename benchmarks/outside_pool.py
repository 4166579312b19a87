"""Memory outside JAX's pool at scale: jaxmem's terms against public figures (issue 52, point 4).

Each row is a public measurement of the memory a training process held outside its framework's pool (NCCL's
buffers, the CUDA context, cuBLAS), and jaxmem's runtime terms for a comparable setting: the CUDA context
estimate (jaxmem.compiler.runtime.context_estimate) and the NCCL communicators of the device groups that
setting's collectives use (runtime.nccl_term: one communicator per distinct group; an all-to-all group's every
peer at the high end), low / estimate / high, and the ratio public / jaxmem's estimate. No constant is fitted
to these rows: the NCCL sizes are NCCL's own (jaxmem/compiler/nccl.py: NCCL_BUFFSIZE 4 MiB, LL 512 KiB, LL128
4.7 MiB per channel and peer; NVLS 2 x 128 KiB x 8 steps per channel and head), the channel counts the range
NCCL_DEBUG=INFO logs show. A term that cannot be derived is a range; `jaxmem calibrate` on the cluster
measures it. The device groups are the mesh's (no compile): what XLA's collectives over each mesh axis use.

    python benchmarks/outside_pool.py > benchmarks/results/outside-pool.md
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GiB = 1 << 30
MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Row:
    setting: str
    public_bytes: int
    public_what: str
    source: str
    gpu: str
    n: int
    hosts: int
    groups: tuple          # the device groups of the setting's collectives
    a2a: tuple = ()        # those an all-to-all runs over
    context: bool = True   # the public figure includes the CUDA context and cuBLAS


def axis_groups(sizes: tuple[int, ...], axis: int) -> list[frozenset[int]]:
    """The device groups of one axis of a row-major mesh of `sizes` (the devices that differ only along it)."""
    n = 1
    for s in sizes:
        n *= s
    stride = 1
    for s in sizes[axis + 1:]:
        stride *= s
    seen: dict[tuple, frozenset[int]] = {}
    for d in range(n):
        key = (d // (stride * sizes[axis]), d % stride)
        seen.setdefault(key, frozenset())
        seen[key] = seen[key] | {d}
    return list(seen.values())


def rows() -> list[Row]:
    everyone = frozenset(range(704))
    expert = axis_groups((11, 64), 1)      # 64-way expert axis: all-to-all (dispatch/combine) and its reductions
    data = axis_groups((11, 64), 0)        # the 11-way data axis: the gradients' reduction
    fsdp64 = [frozenset(range(64))]
    return [
        Row("GB200 NVL72, 704 processes, 64-way expert axis (data 11 x expert 64)", int(28.6 * GiB),
            "NCCL, cuBLAS and the CUDA context outside the pool, per GPU",
            "marin-community/marin public threads (issue 52)", "gb200", 704, 176, (*expert, *data, everyone),
            tuple(expert)),
        Row("NeMo Llama-3-8B, 8 x B200 (FSDP over 8)", int(3.23 * GiB),
            "nvidia-smi less PyTorch's reserved memory, per GPU", "public NeMo log (issue 52)", "b200", 8, 1,
            (frozenset(range(8)),)),
        Row("one all-to-all on 8 x H100 (NVIDIA/nccl#1685)", int((4.34 - 1.06) * 1e9),
            "GPU memory the first all_to_all_single added (4.34 GB after, 1.06 GB before)",
            "github.com/NVIDIA/nccl/issues/1685", "h100", 8, 1, (frozenset(range(8)),), (frozenset(range(8)),),
            context=False),
        Row("a 2-GPU group on 4 x A100 NVLink (NVIDIA/nccl#964)", 544 * 10**6,
            "per 2-GPU process group after a 4 MB all-reduce", "github.com/NVIDIA/nccl/issues/964", "a100-80g", 4, 1,
            (frozenset({0, 1}),), context=False),
        Row("a 4-GPU group on 4 x A100 NVLink (NVIDIA/nccl#964)", 688 * 10**6,
            "per 4-GPU process group after a 4 MB all-reduce", "github.com/NVIDIA/nccl/issues/964", "a100-80g", 4, 1,
            (frozenset(range(4)),), context=False),
        Row("one communicator on 2 x H100, NCCL before 2.21 (openxla/xla#9845)", 1307 * MiB,
            "per communicator (NVLS buffers sized from NCCL_BUFFSIZE then)", "github.com/openxla/xla/issues/9845",
            "h100", 2, 1, (frozenset({0, 1}),), context=False),
        Row("README command 1's model on 64 GB200 (fsdp=64): jaxmem's own, as the issue quotes it", int(4.86 * GiB),
            "jaxmem's out-of-pool estimate before this change (not a measurement)", "issue 52", "gb200", 64, 16,
            tuple(fsdp64)),
    ]


def jaxmem_terms(r: Row) -> tuple[int, int, int, str]:
    """(low, estimate, high, what) of jaxmem's out-of-pool terms for the row's setting."""
    from jaxmem.compiler import calibration, runtime, targets   # noqa: PLC0415 -- jax starts here

    est = calibration.shipped_raw()["cuda_estimates"]
    t = targets.make_target(r.gpu, r.n, hosts=r.hosts)
    term, nvls, k = runtime.nccl_term(t, list(r.groups), r.n, r.hosts, {}, runtime.spec_for(t), est,
                                      frozenset(r.a2a))
    lo, mid, hi = term.low_bytes, term.bytes, term.high_bytes
    what = f"{k} communicator(s)" + (" with NVLS" if nvls else "") + (", all-to-all peers" if r.a2a else "")
    if r.context:
        ctx, _ = runtime.context_estimate(t, est)
        fixed = est["context_fixed_bytes"]
        lo += ctx - fixed + est["context_fixed_low_bytes"]
        mid += ctx
        hi += ctx - fixed + est["context_fixed_high_bytes"]
        what += " + CUDA context"
    return lo, mid, hi, what


def main() -> None:
    print("# Memory outside the pool: public figures against jaxmem's terms (issue 52)\n")
    print("`python benchmarks/outside_pool.py`: the device groups are each setting's mesh axes (no compile); "
          "jaxmem's terms are runtime.nccl_term and runtime.context_estimate with the shipped estimates. "
          "Ratio: public / jaxmem's estimate; `in range`: the public figure within jaxmem's low..high.\n")
    print("| setting | public | what the public figure is | source | jaxmem low | estimate | high | jaxmem counts | "
          "ratio | in range |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows():
        lo, mid, hi, what = jaxmem_terms(r)
        inside = "yes" if lo <= r.public_bytes <= hi else ("above" if r.public_bytes > hi else "below")
        print(f"| {r.setting} | {r.public_bytes / GiB:.2f} GiB | {r.public_what} | {r.source} | {lo / GiB:.2f} GiB | "
              f"{mid / GiB:.2f} GiB | {hi / GiB:.2f} GiB | {what} | {r.public_bytes / mid:.2f} | {inside} |")


if __name__ == "__main__":
    main()
