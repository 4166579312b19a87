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


# ---------------------------------------------------------------- one communicator's buffers on one GPU


@dataclasses.dataclass(frozen=True)
class NcclCommunicator:
    """One communicator's buffers on one of its GPUs: low / estimate / high, and what they are made of."""

    low: int
    bytes: int
    high: int
    parts: str


def _round(n: int, s: NcclSettings) -> int:
    return -(-n // CUMEM_GRANULARITY) * CUMEM_GRANULARITY if s.cumem else n


def nccl_communicator(size: int, local: int, span: int, *, nvls_card: bool, cc_major: int,
                      s: NcclSettings) -> NcclCommunicator:
    """The buffers one GPU of a communicator of `size` GPUs holds, `local` of them on its NVLink
    fabric (a host, or an NVLink domain) and spanning `span` hosts.

    * Ring (every collective can run on it, so it is always connected): per channel, this GPU
      receives from one peer and sends to one. A receiving P2P connection holds the LL and LL128
      buffers, and with P2P read (NVLink, sm_80+) the sender holds the Simple buffer
      (src/transport/p2p.cc p2pRecvSetup/p2pSendSetup); over the network LL128 and Simple sit in
      GPU memory with GPUDirect RDMA and LL in host memory (src/transport/net.cc): about
      LL + LL128 + Simple per channel either way.
    * Tree (all-reduce across hosts): up to two more connections per channel, made only when an
      all-reduce picks it (NCCL_RUNTIME_CONNECT=1, the default since 2.22): the high end.
    * NVLS (NVLink SHARP, NVSwitch Hopper and Blackwell): nvlsChannels x 2 x (NCCL_NVLS_CHUNKSIZE x
      NCCL_STEPS) per NVLS head, one head per GPU of the fabric (src/transport/nvls.cc
      ncclNvlsBufferSetup), when an NVLS algorithm is first used: in the estimate, not in the low end.
    """
    conn = s.ll + s.ll128 + s.simple
    # p2p read: the receiver's LL + LL128 in one buffer, the sender's Simple in another; each rounded
    conn_rounded = _round(s.ll + s.ll128, s) + _round(s.simple, s)
    ch_lo, ch_hi = s.channels(NCCL_CHANNELS_NVLINK if local >= 2 else NCCL_CHANNELS_NET)
    ring_lo, ring_hi = ch_lo * conn, ch_hi * conn_rounded
    tree = (2 if span > 1 else 1) * ch_hi * conn_rounded if s.tree and size > 2 else 0
    nvls = 0
    if nvls_card and s.nvls and local >= 2:
        nch = s.nvls_channels or NCCL_NVLS_CHANNELS.get(cc_major, (16, 16))[span > 1]
        nvls = _round(nch * 2 * s.nvls_chunk * NCCL_STEPS * local, s) + _round(nch * 2 * 64 * local, s)  # + credits
    low = ring_lo if s.runtime_connect else ring_lo + tree + nvls   # without runtime connect: all at init
    est = ring_hi + nvls
    high = ring_hi + tree + nvls
    parts = (f"ring {ch_lo}-{ch_hi} channels x {conn / MiB:.1f} MiB"
             + (f" + NVLS {nvls / MiB:,.0f} MiB ({local} heads)" if nvls else "")
             + (f" + tree up to {tree / MiB:,.0f} MiB" if tree else ""))
    return NcclCommunicator(min(low, est), est, max(high, est), parts)


def _fabric_of(d: int, n: int, hosts: int, domain: int | None) -> tuple[int, int]:
    """(host, NVLink fabric) of device `d` of `n` spread evenly over `hosts` hosts."""
    per_host = max(n // max(hosts, 1), 1)
    host = d // per_host
    return host, (d // domain if domain and domain > per_host else host)


# An all-to-all (expert parallelism) connects every peer of its group, not a ring: per peer and channel a P2P
# connection's buffers, made when the first all-to-all runs (NCCL_RUNTIME_CONNECT). NVIDIA/nccl#1685 (8 x H100,
# one all-to-all): 32 channels per pair of GPUs, a 10 MiB and a 2 MiB cuMem buffer each, 1.06 -> 4.34 GB per GPU.
# How many channels NCCL gives each peer is its topology search's answer (fewer as the group grows): the range is
# NCCL_NCHANNELS_PER_NET_PEER's default (2) to what #1685 logged (32); `jaxmem calibrate` on the cluster pins it.
A2A_CHANNELS_PER_PEER = (2, 32)
A2A_PEER_EXTRA = 2 * MiB             # the second buffer #1685 logged per channel and peer


def all_to_all_peers(size: int, s: NcclSettings) -> tuple[int, int]:
    """(low, high) bytes one GPU holds for an all-to-all over `size` GPUs: its size - 1 peers' P2P connections
    at the fewest and the most channels per peer (A2A_CHANNELS_PER_PEER), within NCCL_MIN/MAX_NCHANNELS."""
    peers = max(size - 1, 0)
    lo, hi = s.channels(A2A_CHANNELS_PER_PEER)
    conn = s.ll + s.ll128 + s.simple
    return peers * lo * conn, peers * hi * (_round(conn, s) + A2A_PEER_EXTRA)
