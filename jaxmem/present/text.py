"""Plain-text results of the measuring commands (verify, calibrate) and the GPU catalogue."""

from __future__ import annotations

from rich.table import Table

from jaxmem.present.console import make_console
from jaxmem.truth.monitor import monitor_lines
from jaxmem.units import fmt_bytes


def verify_lines(result, mesh: str, layout: str) -> list[str]:
    """`jaxmem verify`: predicted against measured, per device and at the peak, and how it was measured."""

    m = result.method
    lines = [f"{result.report.model} on {m['devices']} x {m['device']} ({m['backend']}), mesh {mesh}, layout {layout}",
             f"{'device':>6}  {'predicted':>12}  {'measured':>12}  {'error':>8}"]
    for d in result.per_device:
        lines.append(f"{d['device']:>6}  {fmt_bytes(d['predicted_peak_bytes']):>12}  "
                     f"{fmt_bytes(d['measured_peak_bytes']):>12}  {d['relative_error']:>+8.2%}")
    lines.append(f"peak: predicted {fmt_bytes(result.predicted_peak_bytes)}, measured "
                 f"{fmt_bytes(result.measured_peak_bytes)}, error {result.relative_error:+.2%}")
    lines.append(f"method: {m['description']}")
    if m["backend"] == "cpu":
        lines.append(f"  baseline RSS {fmt_bytes(m['baseline_bytes'])}, step added {fmt_bytes(m['step_extra_bytes'])} "
                     f"for all {m['devices']} device(s); {m['split']}")
    lines.append(f"  runtime overhead in the prediction: {fmt_bytes(m['runtime_overhead']['bytes_per_device'])} "
                 f"per device ({m['runtime_overhead']['source']})")
    lines += monitor_lines(result.monitor)
    lines += [f"warning: {w}" for w in result.warnings]
    return lines


def calibration_lines(cal) -> list[str]:
    """`jaxmem calibrate`: each measurement, the overhead kept, and where it was stored."""
    lines = [f"{r['devices']} device(s), width {r['width']}, batch {r['batch']}: measured "
             f"{fmt_bytes(r['measured_bytes'])}, XLA {fmt_bytes(r['xla_lower_bound_bytes'])}, "
             f"excess {fmt_bytes(r['excess_bytes'])}" for r in cal.runs]
    o = cal.overhead
    lines.append(f"{cal.kind}: in-pool {fmt_bytes(o.in_pool_bytes)} per device + {fmt_bytes(o.per_process_bytes)} "
                 f"per process, out-of-pool {fmt_bytes(o.out_of_pool_bytes)} (measured {o.measured_at})")
    if cal.kind != "cpu":
        nccl = "not measured (one GPU): the estimate stays" if o.nccl_communicator_bytes is None else \
            fmt_bytes(o.nccl_communicator_bytes)
        lines.append(f"  runtime terms: allocator {fmt_bytes(o.in_pool_bytes)} in the pool; cuda_context "
                     f"{fmt_bytes(o.out_of_pool_bytes)} outside; one NCCL communicator {nccl}")
    lines.append(f"stored in {cal.path}" if cal.path else "not stored (--dry-run)")
    return lines


def cache_lines(d: dict, *, cleared: bool) -> list[str]:
    """`jaxmem cache`: where the compile cache is and what it holds (d: jaxmem.compiler.cache.info/clear)."""
    lines = [f"removed {d['removed']} file(s) from {d['path']}"] if cleared else []
    partial = f", {d['partial_writes']} partial write(s) left by killed writers" if d["partial_writes"] else ""
    lines.append(f"{d['path']}: {d['entries']} entries, {fmt_bytes(d['bytes'])}{partial}")
    k = d.get("key")
    if k and k["state"] != "missing":   # who holds the key is who can sign (forge) an entry
        trust = "trusted" if k["trusted"] else "NOT trusted: its entries are not used"
        lines.append(f"key {k['path']}: owner {k['owner'] or '?'}, mode {k['mode'] or '?'}, fingerprint "
                     f"{k['fingerprint'] or '-'}; {trust} ({k['why']})")
    elif k:
        lines.append(f"key {k['path']}: none yet (the first compile stored makes one)")
    if k and k.get("read_only"):
        lines.append("read-only (JAXMEM_CACHE_READONLY): entries are read, nothing is written")
    return lines


def print_gpus(rows: list[dict]) -> None:
    """`jaxmem gpus`: the catalogue as a table (rows: jaxmem.compiler.targets.catalogue_rows)."""

    t = Table(title="GPU targets (compiled for devicelessly)", title_justify="left")
    for col in ("name", "device", "memory", "compute capability", "aliases"):
        t.add_column(col)
    hosts = Table(title="Cloud machine types (a card in a provider's host: its NICs time collectives across hosts)",
                  title_justify="left")
    for col in ("name", "card", "network per GPU", "host memory per GPU", "aliases"):
        hosts.add_column(col)
    for r in rows:
        if r.get("card"):
            perf = r["performance"]
            network = f"{perf['inter_host_bandwidth'] * 8 / 1e9:g} Gb/s ({perf['inter_host_link']})"
            hosts.add_row(r["name"], r["card"], network, fmt_bytes(perf["host_memory"]), ", ".join(r["aliases"]))
            continue
        t.add_row(r["name"] + (" (default)" if r["default"] else ""), r["description"], fmt_bytes(r["memory_bytes"]),
                  r["compute_capability"], ", ".join(r["aliases"]))
    console = make_console()   # off a terminal: not cut to 80 columns
    console.print(t)
    if hosts.row_count:
        console.print(hosts)
    console.print("Also: --gpu local (the attached GPU), --gpu cpu (the CPU backend).", highlight=False)
