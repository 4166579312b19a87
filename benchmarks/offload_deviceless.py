"""The smallest cases behind `--offload optimizer` and `--base-dtype int4` on a deviceless GPU compile.

    python benchmarks/offload_deviceless.py

Prints, for one H100 compiled without a GPU:
1. the topology device's memories (none) and what becomes of a pinned_host NamedSharding (its kind is dropped);
2. a momentum update whose state arrives donated and leaves through jax.device_put(.., Space.Host):
   XLA's memory analysis puts the state in host memory (host_argument), not in device arguments;
3. the same without donation: the argument stays on the device;
4. XLA's argument bytes for int8 vs int4 arrays (4-bit values two to a byte).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxmem.compiler import targets  # noqa: E402
from jaxmem.program import layouts  # noqa: E402

N = 1 << 20   # 4 MiB of fp32


def memory(compiled) -> dict:
    m = compiled.memory_analysis()
    keys = ("argument", "output", "alias", "temp", "host_argument", "host_output", "host_alias", "host_temp")
    return {k: int(getattr(m, f"{k}_size_in_bytes")) for k in keys}


def main() -> None:
    target = targets.make_target("h100", 1)
    mesh = layouts.build_mesh(target.devices, layouts.parse_mesh("data=1"))
    dev = NamedSharding(mesh, P())
    print("1. device memories:", target.devices[0].addressable_memories())
    print("   NamedSharding(..., memory_kind='pinned_host').memory_kind =",
          NamedSharding(mesh, P(), memory_kind="pinned_host").memory_kind)

    p = jax.ShapeDtypeStruct((N,), jnp.float32, sharding=dev)

    def step(p, m):
        m = jax.device_put(m, jax.memory.Space.Device)
        m = 0.9 * m + jnp.cos(p)
        return p - 0.1 * m, jax.device_put(m, jax.memory.Space.Host)

    donated = jax.jit(step, donate_argnums=(0, 1)).lower(p, p).compile()
    print("2. donated state, moved to host in the step:", memory(donated))
    kept = jax.jit(step).lower(p, p).compile()
    print("3. not donated:                            ", memory(kept))

    for dtype in (jnp.int8, jnp.int4):
        x = jax.ShapeDtypeStruct((1024, 1024), dtype, sharding=dev)
        c = jax.jit(lambda a: a.astype(jnp.float32).sum()).lower(x).compile()
        print(f"4. {jnp.dtype(dtype).name}[1024,1024] argument bytes:", memory(c)["argument"])


if __name__ == "__main__":
    main()
