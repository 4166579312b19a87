"""What one compile yields, as plain data: XLA's memory numbers (:class:`CompiledStats`) and
everything an analysis reads from the compile (:class:`Artifacts`). A leaf: the compiler that
makes them and the cache that stores them both import it."""

from __future__ import annotations

import base64
import binascii
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class CompiledStats:
    """XLA's per-device memory numbers for one compiled program (bytes)."""

    argument: int
    output: int
    alias: int
    temp: int
    generated_code: int
    peak: int            # XLA's own peak_memory_in_bytes (0 when the backend gives none)
    host_temp: int
    lower_s: float
    compile_s: float
    notes: tuple[str, ...] = ()   # how the compile deviated from the default pipeline
    # pinned host memory (--offload): XLA's host_* numbers
    host_argument: int = 0
    host_output: int = 0
    host_alias: int = 0
    # XLA:GPU's rematerialization falling short of its memory limit, as XLA logged it
    remat_failures: tuple[str, ...] = ()
    # the XLA options jaxmem compiled with, `name=value` (speed options a refusing XLA dropped are not among them)
    compile_options: tuple[str, ...] = ()
    # the constants XLA keeps in device memory, where generated_code does not already hold them (XLA:GPU
    # counts them there for an executable it built whole: jaxmem.xla.memory_stats.constant_bytes)
    constant: int = 0

    @property
    def lower_bound(self) -> int:
        """XLA's device-memory lower bound: code + constants + args + outputs - aliased + temp."""
        return self.generated_code + self.constant + self.argument + self.output - self.alias + self.temp


@dataclasses.dataclass(frozen=True)
class Artifacts:
    """Everything an analysis reads from one compile, and nothing live: it is cached on disk and
    re-processed identically, so a cached answer equals a fresh one.

    stats: XLA's memory numbers. cost: ``compiled.cost_analysis()`` (flops, bytes accessed, ...;
    empty where the backend gives none, as for deviceless GPU compiles). hlo_text: the optimized,
    scheduled HLO (``compiled.as_text()``): collectives and replica groups are read from it.
    dump: the serialized after-optimizations HloProto holding the buffer assignment (explain only).
    """

    stats: CompiledStats
    cost: dict
    hlo_text: str
    dump: bytes | None = None
    cached: bool = False     # read from the disk cache (not part of the answer: not serialized)
    # the dump already decoded (jaxmem.xla.hlo.decode_hlo_proto), when this run had to; not serialized
    assignment: Any = dataclasses.field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        return {"stats": {**dataclasses.asdict(self.stats), "notes": list(self.stats.notes),
                          "remat_failures": list(self.stats.remat_failures),
                          "compile_options": list(self.stats.compile_options)}, "cost": self.cost,
                "hlo_text": self.hlo_text,
                "dump": None if self.dump is None else base64.b64encode(self.dump).decode("ascii")}

    @classmethod
    def from_json(cls, d: dict, *, cached: bool = False) -> Artifacts:
        """The Artifacts `to_json` wrote. Raises ValueError (or KeyError, TypeError) on anything
        else: a cache entry of the wrong shape must be a miss, not a wrong number read later."""

        if not isinstance(d, dict) or not isinstance(d.get("stats"), dict):
            raise ValueError("not an Artifacts object")
        st = dict(d["stats"])
        names = {f.name: f for f in dataclasses.fields(CompiledStats)}
        if set(st) - set(names) or not {n for n, f in names.items() if f.default is dataclasses.MISSING} <= set(st):
            raise ValueError(f"stats fields {sorted(st)} are not CompiledStats'")
        for n, v in st.items():
            if n in ("notes", "remat_failures", "compile_options"):
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise ValueError(f"stats.{n} must be a list of strings")
            elif n in ("lower_s", "compile_s"):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ValueError(f"stats.{n} must be a number")
            elif isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"stats.{n} must be a whole number of bytes")
        st["notes"] = tuple(st.get("notes", ()))
        st["remat_failures"] = tuple(st.get("remat_failures", ()))
        st["compile_options"] = tuple(st.get("compile_options", ()))
        cost = d.get("cost") or {}
        if not isinstance(cost, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in cost.values()):
            raise ValueError("cost must map names to numbers")
        if not isinstance(d.get("hlo_text"), str):
            raise ValueError("hlo_text must be a string")
        dump = d.get("dump")
        if dump is not None:
            if not isinstance(dump, str):
                raise ValueError("dump must be base64 text")
            try:
                dump = base64.b64decode(dump, validate=True)
            except binascii.Error as e:
                raise ValueError(f"dump is not base64: {e}") from None
        return cls(stats=CompiledStats(**st), cost=dict(cost), hlo_text=d["hlo_text"], dump=dump, cached=cached)
