"""NCCL's settings that change its memory, read from the environment, and NCCL's own buffer
constants (jax-free: the environment is checked with them before jax starts; jaxmem.env)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jaxmem.errors import UserError

MiB = 1 << 20


# ---------------------------------------------------------------- NCCL's buffers, from how NCCL allocates them
#
# Every constant below is NCCL's own (NVIDIA/nccl, the version JAX's CUDA plugin requires: nvidia-nccl >= 2.27;
# read at 2.30.7): what one communicator allocates on each GPU is its connections' buffers -- per channel and
# per peer, one buffer per protocol -- and, with NVLink SHARP, one NVLS buffer per channel and NVLS head.

NCCL_STEPS = 8                      # src/include/device.h: NCCL_STEPS
NCCL_LL_BUFFSIZE = 8 * 512 * NCCL_STEPS * 16       # src/init.cc DEFAULT_LL_BUFFSIZE: NCCL_LL_LINES_PER_THREAD (8) x
#                                     NCCL_LL_MAX_NTHREADS (512) x NCCL_STEPS x sizeof(ncclLLFifoLine) (16) = 512 KiB
NCCL_LL128_BUFFSIZE = 120 * 640 * NCCL_STEPS * 8   # src/init.cc DEFAULT_LL128_BUFFSIZE: NCCL_LL128_ELEMS_PER_THREAD
#                                     (120) x NCCL_LL128_MAX_NTHREADS (640) x NCCL_STEPS x 8 B = 4,915,200 B
NCCL_SIMPLE_BUFFSIZE = 1 << 22      # src/init.cc DEFAULT_BUFFSIZE (NCCL_BUFFSIZE): 4 MiB
NCCL_MAXCHANNELS = 64               # src/include/device.h: MAXCHANNELS
NCCL_NVLS_CHUNKSIZE = 128 * 1024    # src/transport/nvls.cc: NCCL_NVLS_CHUNKSIZE default (since 2.21.5)
# src/transport/nvls.cc: NVLS_NCHANNELS_SM90 (16); on sm_100 NVLS_NCHANNELS_SM100_NVL (24, one node) and
# NVLS_NCHANNELS_SM100 (32, several): (one host, several hosts) by compute capability major
NCCL_NVLS_CHANNELS: dict[int, tuple[int, int]] = {9: (16, 16), 10: (24, 32)}
CUMEM_GRANULARITY = 2 * MiB         # cuMemGetAllocationGranularity on Hopper/Blackwell; NCCL rounds each cuMem
#                                     buffer up to it (src/transport/p2p.cc, nvls.cc: ALIGN_SIZE(size, granularity))
# How many channels NCCL builds for a communicator is its topology search's answer, not a constant: the range is
# what NCCL_DEBUG=INFO printed in public logs -- NVLink/NVSwitch: 16 coll channels on 8 x H800 (NVIDIA/nccl#892),
# 24 on 2 NVLink GPUs (NVIDIA/nccl#1781), 32 on DGX H100 (MAXCHANNELS before 2.23); one GPU per host over the
# network: 8 on 4 GPUs of 2 hosts (NVIDIA/nccl#1189), 2 per NIC at the least (NCCL_NCHANNELS_PER_NET_PEER's default).
NCCL_CHANNELS_NVLINK = (16, 32)
NCCL_CHANNELS_NET = (2, 16)


@dataclasses.dataclass(frozen=True)
class NcclSettings:
    """The NCCL variables that change its memory, read from the environment (NCCL's names and defaults)."""

    ll: int = NCCL_LL_BUFFSIZE
    ll128: int = NCCL_LL128_BUFFSIZE
    simple: int = NCCL_SIMPLE_BUFFSIZE
    min_channels: int | None = None       # NCCL_MIN_NCHANNELS / NCCL_MIN_CTAS
    max_channels: int | None = None       # NCCL_MAX_NCHANNELS / NCCL_MAX_CTAS
    nvls: bool = True                     # NCCL_NVLS_ENABLE (default 2: on where the system supports it)
    nvls_channels: int | None = None      # NCCL_NVLS_NCHANNELS
    nvls_chunk: int = NCCL_NVLS_CHUNKSIZE
    runtime_connect: bool = True          # NCCL_RUNTIME_CONNECT (default 1: connect an algorithm when first used)
    cumem: bool = True                    # NCCL_CUMEM_ENABLE (cuMem buffers, rounded to the granularity)
    tree: bool = True                     # NCCL_ALGO allows Tree
    set_by_env: tuple[str, ...] = ()      # the variables that were set

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NcclSettings:
        seen: list[str] = []

        def num(*names: str) -> int | None:
            for name in names:
                raw = str(env.get(name, "")).strip()
                if raw:
                    try:
                        v = int(raw, 0)
                    except ValueError:
                        raise UserError(f"{name}={raw!r}: NCCL reads an integer there; unset it or give a "
                                        "number") from None
                    seen.append(f"{name}={raw}")
                    return v
            return None

        def flag(name: str, default: bool) -> bool:
            raw = str(env.get(name, "")).strip()
            if not raw:
                return default
            seen.append(f"{name}={raw}")
            return raw != "0"

        s = cls()
        ll, ll128, simple = num("NCCL_LL_BUFFSIZE"), num("NCCL_LL128_BUFFSIZE"), num("NCCL_BUFFSIZE")
        algo = str(env.get("NCCL_ALGO", "")).strip().lower()
        nvls, tree = flag("NCCL_NVLS_ENABLE", True), True
        if algo:   # "Ring,Tree", or "^NVLS" to exclude (docs: NCCL_ALGO)
            seen.append(f"NCCL_ALGO={env['NCCL_ALGO']}")
            names = {a.strip() for a in algo.lstrip("^").split(",")}
            has_nvls, has_tree = bool(names & {"nvls", "nvlstree"}), "tree" in names or "nvlstree" in names
            nvls &= not has_nvls if algo.startswith("^") else has_nvls
            tree = "tree" not in names if algo.startswith("^") else has_tree
        out = dataclasses.replace(
            s, ll=s.ll if ll is None or ll < 0 else ll, ll128=s.ll128 if ll128 is None or ll128 < 0 else ll128,
            simple=s.simple if simple is None or simple < 0 else simple,
            min_channels=num("NCCL_MIN_NCHANNELS", "NCCL_MIN_NRINGS", "NCCL_MIN_CTAS"),
            max_channels=num("NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS", "NCCL_MAX_CTAS"),
            nvls=nvls, nvls_channels=num("NCCL_NVLS_NCHANNELS"),
            nvls_chunk=num("NCCL_NVLS_CHUNKSIZE") or NCCL_NVLS_CHUNKSIZE,
            runtime_connect=flag("NCCL_RUNTIME_CONNECT", True), cumem=flag("NCCL_CUMEM_ENABLE", True), tree=tree)
        return dataclasses.replace(out, set_by_env=tuple(seen))

    def channels(self, default: tuple[int, int]) -> tuple[int, int]:
        """The (fewest, most) channels NCCL may build, within NCCL_MIN/MAX_NCHANNELS (src/graph/connect.cc)."""
        lo, hi = default
        cap = min(self.max_channels, NCCL_MAXCHANNELS) if self.max_channels and self.max_channels > 0 \
            else NCCL_MAXCHANNELS
        floor = min(max(self.min_channels or 0, 0), cap)
        return max(min(lo, cap), floor), max(min(hi, cap), floor)
