"""Terminal rendering of a Report (rich)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from jaxmem.compiler import versions
from jaxmem.compiler.steptime import band, peaks_text
from jaxmem.plan import throughput
from jaxmem.plan.compare import in_rank_order, label, probe_count, ranked, row_label, shown
from jaxmem.present import levers
from jaxmem.present.console import make_console
from jaxmem.program.splits import header
from jaxmem.report import BREAKDOWN_HELP, Report, breakdown_in_order, tight_text, verdict_of
from jaxmem.units import fmt_bytes, fmt_seconds, si

MODULE_ROWS = 15          # rows of the per-module table on a terminal; --json and --html keep every module


def module_rows(modules, limit: int | None = MODULE_ROWS) -> tuple[list[tuple[str, int, int]], tuple[int, int]]:
    """(name, bytes, buffers) rows for the terminal, largest first, and (modules, bytes) left out.

    Buffers outside any module (XLA's own ops on params and the optimizer update) are one row;
    Python scopes jax records inside a module path (`loss_fn.<locals>.<dictcomp>`) are dropped,
    so they merge into their module.
    """
    merged: dict[str, list[int]] = {}
    for m in modules:
        path = m.module_path or ""
        if not path or path.startswith("(no module"):
            name = "(outside any module)"
        else:
            parts = [p for p in path.split("/") if "<" not in p and "." not in p]
            name = "/".join(parts) or "(outside any module)"
        acc = merged.setdefault(name, [0, 0])
        acc[0] += m.bytes
        acc[1] += m.buffers
    rows = sorted(((n, b, k) for n, (b, k) in merged.items()), key=lambda r: -r[1])
    if limit is None or len(rows) <= limit:
        return rows, (0, 0)
    rest = rows[limit:]
    return rows[:limit], (len(rest), sum(r[1] for r in rest))


# remat policies that keep nothing between the checkpoints: --remat full would change nothing
_SAVES_NOTHING = ("full", "nothing_saveable")


def hints(r: Report) -> list[str]:
    """What to change so it fits, for each of the three largest parts that is at least a tenth of the peak."""
    b = r.breakdown
    peak = r.per_device_peak_bytes or sum(b.values()) or 1
    remat = str(r.options.get("remat") or "none")
    out = []
    for key, value in sorted(b.items(), key=lambda kv: -kv[1])[:3]:
        if value < peak / 10:
            continue   # not what makes the peak
        part = f"{key} {value / peak:.0%} of the peak"
        if key == "activations_and_temporaries":
            fixes = ["a smaller --batch", "or --accum N"]
            if remat not in _SAVES_NOTHING:
                stronger = "--remat full (or dots_saveable)" if remat == "none" else "--remat full"
                # a model file without a `remat` argument is checkpointed by --remat-at (the report cannot tell);
                # a config.json decoder takes --remat itself
                where = "" if r.options.get("remat_at") or r.hf_config else \
                    " with --remat-at BLOCK if the model file takes no remat"
                fixes.insert(0, stronger + where)
            out.append(f"{part}: {', '.join(fixes)}")
        elif key in ("optimizer_state", "params", "gradients") and r.layout == "dp":
            out.append(f"{part}, replicated under dp: --layout fsdp shards params, gradients and optimizer state")
        elif key == "optimizer_state":
            out.append(f"{part}: --optimizer adafactor or lion, or --precision bf16-pure")
        elif key == "params" and r.layout == "fsdp":
            out.append(f"{part}: more devices on the data axis, or --layout fsdp_tp with a model axis")
    return out + levers.hints(r)   # the choices' levers: attention scores, logits, moments, fp32, the memory fraction


def runtime_lines(r) -> list[str]:
    """The runtime's terms, in JAX's pool (in the peak) and outside it (bounding the pool), with their sources."""
    rt = r.runtime or {}
    if not rt.get("terms"):
        return [f"runtime_overhead: {r.runtime_overhead_source}"]
    lines = [(f"runtime per device: {fmt_bytes(rt['in_pool_bytes'])} in JAX's pool (runtime_overhead), "
              f"{fmt_bytes(rt['out_of_pool_bytes'])} outside it (sources: --json, runtime.terms)")]
    for t in rt["terms"]:
        where = "in pool" if t["in_pool"] else "outside"
        lo, hi = t.get("low_bytes", t["bytes"]), t.get("high_bytes", t["bytes"])
        span = f" (range {fmt_bytes(lo)}-{fmt_bytes(hi)})" if hi > lo else ""
        lines.append(f"  {where:<7} {t['name']:<18} {fmt_bytes(t['bytes']):>10}  {t.get('status', '')}{span}: "
                     f"{t['detail']}")
    return lines


def fraction_band_line(r) -> str | None:
    """The memory fractions the step fits at (Report.fraction_floor / fraction_ceiling), or why none does:
    "fits with XLA_PYTHON_CLIENT_MEM_FRACTION between 0.23 and 0.98 (...)"; None without a band."""
    lo, hi, total = r.fraction_floor, r.fraction_ceiling, r.target.memory_bytes
    if lo is None or hi is None or not total:
        return None
    terms = (r.runtime or {}).get("terms") or []
    in_high = sum(t.get("high_bytes", t["bytes"]) for t in terms if t["in_pool"])
    out_high = sum(t.get("high_bytes", t["bytes"]) for t in terms if not t["in_pool"])
    need = r.per_device_peak_bytes - (r.runtime or {}).get("in_pool_bytes", 0) + in_high
    leaves = total - out_high
    platform = " (for a bfc or cuda_async pool: the platform allocator reads no fraction)" \
        if (r.choices or {}).get("allocator") == "platform" else ""
    if lo > hi:
        return (f"no fraction fits{platform}: the pool needs {fmt_bytes(need)}, the card leaves {fmt_bytes(leaves)} "
                f"once the memory outside the pool is resident at its high end ({fmt_bytes(out_high)}; fractions "
                f"{lo:g} > {hi:g})")
    f2, c2 = -(-round(lo * 10_000) // 100) / 100, (round(hi * 10_000) // 100) / 100
    shown = (f"{f2:.2f} and {c2:.2f}") if f2 <= c2 else f"{lo:g} and {hi:g}"
    return (f"fits with XLA_PYTHON_CLIENT_MEM_FRACTION between {shown}{platform} (floor: the pool must hold "
            f"{fmt_bytes(need)}; ceiling: the card leaves {fmt_bytes(leaves)} beside the memory outside the pool, "
            "each at the high end of its estimates)")


def _step_estimate(r: Report | None) -> str:
    """`412 ms (398-431 ms)`: the estimate and its band (the spread of the rates it rests on)."""

    b = band((r.step_time or {}) if r is not None else None)
    if b is None:
        return "-"
    e, lo, hi = b
    return fmt_seconds(e) if lo == hi else f"{fmt_seconds(e)} ({fmt_seconds(lo)}-{fmt_seconds(hi)})"


def _peaks(st: Mapping[str, Any]) -> str:
    if st.get("compute_peaks"):
        return peaks_text(st["compute_peaks"])
    # a report saved before the estimate read each dot's rate: one peak for every FLOP
    return f"{st['peak_flops'] / 1e12:,.0f} TFLOP/s ({st['peak_flops_kind']})"


def step_time_lines(st: Mapping[str, Any]) -> list[str]:
    """The estimated step time: the number, its parts, and the rule (always called an estimate)."""
    if not st:
        return []
    if not st.get("available"):
        return [f"step time: no estimate ({st.get('reason', 'unavailable')})"]
    comm = ", ".join(f"{c['kind']} {fmt_seconds(c['time_s'])} over {'+'.join(c['axes']) or '-'} ({c['link']})"
                     for c in st["collectives"] if c["time_s"] > 0)
    if "kernel_classes" not in st:   # a report saved before the per-kernel model
        return [f"step time (estimate): {fmt_seconds(st['estimate_s'])} = max(compute {fmt_seconds(st['compute_s'])}, "
                f"memory {fmt_seconds(st['memory_s'])}) + communication {fmt_seconds(st['communication_s'])}"
                + (f" [{comm}]" if comm else "") + f"; {fmt_seconds(st['overlapped_s'])} if all overlapped"]
    classes = ", ".join(f"{c['class']} {fmt_seconds(c['time_s'])} ({c['launches']:,} launches)"
                        for c in st["kernel_classes"])
    return [f"step time (estimate): {fmt_seconds(st['estimate_s'])}, band {fmt_seconds(st['low_s'])}-"
            f"{fmt_seconds(st['high_s'])}: kernels busy {classes}; communication exposed "
            f"{fmt_seconds(st['exposed_communication_s'])}" + (f" [{comm}]" if comm else "")
            + (f" + host transfers {fmt_seconds(st['host_transfer_s'])} ({si(st['host_transfer_bytes'], 'B')} "
               "over PCIe)" if st.get("host_transfer_s") else ""),
            (f"  {si(st['flops'], 'FLOP')} and {si(st['bytes_accessed'], 'B')} moved per device per step (each "
             f"kernel's own reads and writes, loops x trip count); each kernel class at its measured rate "
             f"(peaks: {_peaks(st)}); leaves out {st['leaves_out']}")] + dequantization_lines(st)


def xla_remat_line(x: Mapping[str, Any]) -> str:
    """What XLA's rematerialization recomputes each step, and the step without it (Report.xla_remat)."""
    line = (f"XLA rematerialized {x['instructions']:,} instructions to stay under its limit: "
            f"{x.get('launches', 0):,} launches, {fmt_seconds(x.get('seconds', 0.0))} of the step estimate")
    peak, step = x.get("unconstrained_peak_bytes"), x.get("unconstrained_step_s")
    if peak is not None:
        line += (f"; without it (compiled at a limit where XLA recomputes nothing) {fmt_bytes(peak)} per device"
                 + (f", {fmt_seconds(step)} a step" if step is not None else "")
                 + ": what a larger pool or --xla_gpu_memory_limit_slop_factor would buy")
    return line


def dequantization_lines(st: Mapping[str, Any]) -> list[str]:
    """The quantized base's decoding, kernel by kernel (steptime.dequantization): in the estimate already."""
    dq = st.get("dequantization")
    if not dq:
        return []
    parts = []
    if dq["separate_launches"]:
        parts.append(f"{dq['separate_launches']:,} decoding kernels of their own, {si(dq['separate_bytes'], 'B')} "
                     f"moved, {fmt_seconds(dq['separate_s'])}")
    if dq["in_gemm_launches"]:
        parts.append(f"{dq['in_gemm_launches']:,} GEMMs decoding their operand as they load it (timed as GEMMs)")
    return [(f"  dequantization of the quantized base (in the estimate): {'; '.join(parts)}; "
             f"{si(dq['code_bytes'], 'B')} of integer codes read per step (forward, remat and backward)")]


def finetune_lines(r: Report) -> list[str]:
    """What trains and what is frozen (params' bytes split), and what lives in pinned host memory."""
    out = []
    if r.frozen_param_count and r.trainable_param_count is not None:  # (set together)
        o = r.options
        how = []
        if o.get("lora_rank"):
            how.append(f"LoRA r={o['lora_rank']}" + (f" on {o['lora_targets']!r}" if o.get("lora_targets") else ""))
        if o.get("base_dtype"):
            how.append(f"base {o['base_dtype']}")
        if o.get("freeze"):
            how.append(f"--freeze {o['freeze']!r}")
        out.append(f"trainable {r.trainable_param_count / 1e6:,.2f} M params ({fmt_bytes(r.trainable_bytes)}/device, "
                   f"+ gradients, optimizer state); frozen {r.frozen_param_count / 1e6:,.1f} M "
                   f"({fmt_bytes(r.frozen_bytes)}/device)" + (f"  [{', '.join(how)}]" if how else ""))
    if r.host:
        parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in r.host.items())
        out.append(f"pinned host memory per device (not in the device peak): {parts}")
    return out


def pipeline_lines(r: Report) -> list[str]:
    """The pipeline over the stage axis: schedule, stages and their layers, what is in flight at the peak."""
    p = r.pipeline
    if not p:
        return []
    rep = f", {p['repeats']} repeats of {p['layers_per_repeat']} layers" if p["schedule"] == "circular" else ""
    out = [(f"pipeline {p['schedule']} over {p['axis']}: {p['stages']} stages x {p['layers_per_stage']} of "
            f"{p['layers']} layers{rep}, {p['microbatches']} microbatches, {p['iterations']} iterations, bubble "
            f"{p['bubble']:.0%} of the stage time" + ("; each stage pass checkpointed at its input"
                                                     if p.get("stage_remat") else ""))]
    if "activations_in_flight" in p:
        out.append(f"  at the peak: {fmt_bytes(p['activations_in_flight'])} of activations saved by the stage loop "
                   f"({p['microbatches_in_flight']} microbatches in flight per stage), "
                   f"{fmt_bytes(p['transfers'])} of stage-to-stage transfer buffers")
    out.append("  " + "; ".join(f"stage {s['stage']}: layers {s['layers'][0]}-{s['layers'][1] - 1}" for s in r.stages)
               + f"; each stage's peak {fmt_bytes(r.per_device_peak_bytes)} (one SPMD program: every stage runs it)")
    out.extend(f"  {n}" for n in p.get("chosen", ()))
    return out


def render(r: Report, console: Console | None = None) -> None:
    console = console or make_console()
    _print_header(r, console)
    _print_breakdown(r, console)
    _print_verdict(r, console)
    _print_warnings_and_peak(r, console)
    _print_footer(r, console)


def _print_header(r: Report, console: Console) -> None:
    """The model, the target, the mesh and the options; what the model file asked for (configs, adapters,
    pipeline stages, activation constraints, checkpoints)."""
    t = r.target
    mesh = ",".join(f"{n}={s}" for n, s in r.mesh)
    where = f"{t.description} ({t.gpu}{', deviceless compile' if t.deviceless else ''})"
    hosts = f", {t.hosts} hosts" if t.hosts > 1 else ""
    console.print(Text.assemble(("jaxmem ", "bold"), (r.model, "bold cyan"), f"  on {t.devices} x {where}{hosts}"))
    opts = r.options
    if r.mesh_roles:  # each axis with its role and what it splits, on a line of its own

        explicit = "  (axes Explicit)" if opts.get("axis_types") == "explicit" else ""
        console.print(f"mesh {header(r.mesh_roles)}{explicit}")
    lead = "" if r.mesh_roles else f"mesh {mesh}  "
    # a custom step's precision is its own (jaxmem casts nothing): never the --precision default as if given
    own = (r.choices.get("sources") or {}).get("precision") == "model"
    precision = r.choices["precision"] if own else opts["precision"]
    console.print(f"{lead}layout {r.layout}  precision {precision}  optimizer {opts['optimizer']}  "
                  f"batch {opts['batch']}  accum {opts['accum']}  remat {opts['remat']}  "
                  f"params {r.param_count / 1e6:,.1f} M")
    if r.choices:   # every choice that decides the answer with its source, and why where it is not just the flag
        chosen = Text("choices: ")
        for i, (text, source, loud) in enumerate(levers.choice_parts(r)):
            chosen.append((", " if i else "") + text + (" " if source else ""))
            if source:   # a default that changes the answer stands out: the user did not choose it
                chosen.append(f"({source})", "bold yellow" if loud else "dim")
        console.print(chosen)
        for note in levers.choice_notes(r):
            console.print(f"[dim]  {escape(note)}[/dim]")
    if r.hf_config:   # a config.json analyzed (jaxmem/hf): what it names
        hf = r.hf_config
        console.print(escape(f"config {hf['path']}: model_type {hf['model_type']}, {hf['parameters']:,} parameters "
                             "(jaxmem's Flax decoder for it)"))
    for line in finetune_lines(r) + pipeline_lines(r):
        console.print(escape(line))
    ac = r.activation_constraints
    if ac.get("count"):   # the model's own constraints, applied under the mesh in context
        first = ac["applied"][0]
        console.print(escape(f"activation constraints the model applied: {ac['count']} at {ac['sites']} place(s), "
                             f"e.g. {first['spec']} at {first['at']}"))
    if opts.get("remat_at"):
        placed = opts.get("remat_placed") or []
        shown = ", ".join(placed[:6]) + (f", ... ({len(placed)} in all)" if len(placed) > 6 else "")
        console.print(escape(f"checkpoints (--remat-at {opts['remat_at']}, policy {opts['remat']}): {shown}"))


def _print_breakdown(r: Report, console: Console) -> None:
    """The per-device memory at the peak, part by part (with what each part is on a wide terminal)."""
    table = Table(title="per-device memory at the peak", title_justify="left", show_footer=True)
    table.add_column("part", footer="per-device peak")
    table.add_column("bytes", justify="right", footer=fmt_bytes(r.per_device_peak_bytes))
    table.add_column("share", justify="right", footer="100%")
    wide = console.width >= 110  # the explanations only help when they do not wrap every row
    if wide:
        table.add_column("what it is", style="dim")
    peak = max(r.per_device_peak_bytes, 1)
    not_split = any(w.kind == "gradients_not_split" for w in r.warnings)  # --no-explain: see the warning
    for key, value in breakdown_in_order(r.breakdown):
        shown = "not split" if not_split and key == "gradients" else fmt_bytes(value)
        table.add_row(key, shown, f"{100 * value / peak:.1f}%", *([BREAKDOWN_HELP.get(key, "")] if wide else []))
    console.print(table)


def _print_verdict(r: Report, console: Console) -> None:
    """FITS / TIGHT / DOES NOT FIT against the usable memory (hints when it does not fit), the step time
    and the runtime's memory outside XLA's buffers."""
    t = r.target
    if t.usable_bytes is not None:
        v = verdict_of(r)
        verdict = (Text(" FITS ", style="bold black on green") if v == "fits"
                   else Text(" TIGHT ", style="bold black on yellow") if v == "tight"
                   else Text(" DOES NOT FIT ", style="bold white on red"))
        if v == "tight":   # fits at the low end of the runtime's estimates, not at the high end
            verdict.append(f" (hangs on {tight_text(r)}; margin at the estimate {fmt_bytes(r.margin_bytes)})")
        squeezed = next((w for w in r.warnings if w.kind == "xla_rematerialized"), None)
        if squeezed is not None:
            free = f"; without it {fmt_bytes(r.per_device_peak_bytes + squeezed.bytes)}" if squeezed.bytes else ""
            verdict.append(f" (as XLA rematerialized it{free})")
        console.print(Text.assemble(verdict, f"  usable {fmt_bytes(t.usable_bytes)} of {fmt_bytes(t.memory_bytes)} "
                                    f"({t.usable_note}); headroom {fmt_bytes(r.headroom_bytes)}"))
        fb = fraction_band_line(r)
        if fb:
            console.print(escape(fb))
        if not r.fits:
            for h in hints(r):
                console.print(f"  hint: {h}")
        if t.xla_budget_note:
            console.print(f"[dim]{escape(t.xla_budget_note)}[/dim]")
        if r.xla_remat:
            console.print(escape(xla_remat_line(r.xla_remat)))
    else:
        console.print(f"CPU target: {t.usable_note}")
    for i, line in enumerate(step_time_lines(r.step_time)):
        console.print(escape(line) if i == 0 else f"[dim]{escape(line)}[/dim]")
    for line in runtime_lines(r):
        console.print(f"[dim]{escape(line)}[/dim]")


def _print_warnings_and_peak(r: Report, console: Console) -> None:
    """The warnings, then what is live at the peak: the largest buffers, the categories, the modules."""
    for w in r.warnings:
        cost = f" (costs {fmt_bytes(w.bytes)} per device)" if w.bytes else ""
        console.print(f"[yellow]warning[/yellow] {escape(f'[{w.kind}] {w.message}')}{cost}")

    if r.top_buffers:
        tb = Table(title=f"largest buffers live at the peak (of {fmt_bytes(sum(r.peak_categories.values()))})",
                   title_justify="left")
        just: JustifyMethod
        for col, just in (("bytes", "right"), ("shape", "left"), ("category", "left"), ("module", "left"),
                          ("instruction", "left")):
            tb.add_column(col, justify=just)
        for b in r.top_buffers:
            tb.add_row(fmt_bytes(b.size), f"{b.dtype}{b.shape}", b.category, escape(b.module_path or "-"),
                       b.instruction)
        console.print(tb)
    if r.peak_categories:
        console.print("live at the peak by category: " + ", ".join(
            f"{k} {fmt_bytes(v)}" for k, v in sorted(r.peak_categories.items(), key=lambda kv: -kv[1]) if v))
    if r.modules:
        tm = Table(title="live at the peak by module", title_justify="left")
        tm.add_column("module")
        tm.add_column("bytes", justify="right")
        tm.add_column("buffers", justify="right")
        rows, (more, more_bytes) = module_rows(r.modules)
        for name, nbytes, buffers in rows:
            tm.add_row(escape(name), fmt_bytes(nbytes), str(buffers))
        if more:
            tm.add_row(f"[dim]... {more} more (all of them: --json or --html)[/dim]", fmt_bytes(more_bytes), "")
        console.print(tm)

def _print_footer(r: Report, console: Console) -> None:
    """How long lowering and compiling took, and the versions and XLA flags it ran with."""
    tim = r.timings

    console.print(f"[dim]lowered in {tim.get('lower_s', 0):.1f} s, compiled in {tim.get('compile_s', 0):.1f} s, "
                  f"total {tim.get('total_s', 0):.1f} s; {escape(versions.summary(r.versions, r.xla_flags))}[/dim]")


def _found(cell) -> str:
    """The fit-search answer of a row: the value, or none / at least."""
    s = cell.search
    if s is None:
        return "-"
    if s.answer is None or (s.answer == 0 and s.kind != "devices"):
        return "[red]none[/red]"
    return f">= {s.answer}" if s.capped else str(s.answer)


_FOUND_COLUMN = {"batch": "max batch", "devices": "min data size"}


def _proof(cell) -> str:
    """Why the answer is the answer: the compile that fits and the one a step further that does not."""
    s = cell.search

    def at(p) -> str:
        if getattr(p, "error", None):
            return f"{p.value}: refused by the workload ({p.error})"
        peak = "XLA refused it at compile time" if p.peak_bytes is None else fmt_bytes(p.peak_bytes)
        return f"{p.value}: {peak}"

    what = {"batch": "batch", "seq": s.arg, "devices": "data size"}[s.kind]
    parts = []
    if s.fits_at is not None:
        parts.append(f"{what} {at(s.fits_at)} fits")
    if s.fails_at is not None:
        parts.append(f"{at(s.fails_at)} does not")
    if s.capped:
        parts.append("the search stopped at its limit")
    budget = next((p.usable_bytes for p in s.probes if p.usable_bytes), None)
    margin = (f" (budget {fmt_bytes(int(budget * (1 - s.margin)))}: usable less a {s.margin:.0%} margin)"
              if budget else "")

    return ", ".join(parts) + margin + f"; {probe_count(s)}"


def _rank_text(order) -> dict[int, str]:
    """id(cell) -> its rank as the table shows it, rows in table order: `1`, then `=1` for a row tied
    with it."""
    out: dict[int, str] = {}
    seen: set[int] = set()
    for c in order:
        if c.rank is not None:
            out[id(c)] = f"={c.rank}" if c.rank in seen else str(c.rank)
            seen.add(c.rank)
    return out


def render_comparison(cells, console: Console | None = None) -> None:
    """One row per combination: the rows that fit first, by throughput per device (their rank), then
    the others by peak, the errors last. With a fit search, each row's answer and its proof (the
    compile that fits, the one a step further that does not); its rate is at that answer."""
    console = console or make_console()
    cells = ranked(list(cells))
    axes = list(dict.fromkeys(k for c in cells for k in c.choice))
    table = Table(title="per-device peak and throughput by choice", title_justify="left")
    for a in axes:
        table.add_column(a)
    find = next((c.search for c in cells if getattr(c, "search", None) is not None), None)
    found_col = () if find is None else (_FOUND_COLUMN.get(find.kind, f"max {find.arg}"),)
    unit = throughput.unit_of([c.throughput for c in cells])
    for col in ("peak", "state", "acts+temps", "fits", "headroom", "step (est., band)", f"{unit}/s/device",
                "rank") + found_col:
        table.add_column(col, justify="right")
    order = in_rank_order(cells)
    rank_text = _rank_text(order)
    for c in order:
        values = [shown(c.choice).get(a, "-") for a in axes]
        if c.report is None:
            table.add_row(*values, "-", "-", "-", "[red]error[/red]", "see below", "-", "-", "-",
                          *(("-",) if find else ()))
            continue
        b = c.report.breakdown
        state = b["params"] + b["optimizer_state"] + b["gradients"]
        fits = {"fits": "[green]yes[/green]", "tight": "[yellow]tight[/yellow]", "does_not_fit": "[red]no[/red]"}.get(
            verdict_of(c.report) or "", "-")
        table.add_row(*values, fmt_bytes(c.report.per_device_peak_bytes), fmt_bytes(state),
                      fmt_bytes(b["activations_and_temporaries"]), fits, fmt_bytes(c.report.headroom_bytes),
                      _step_estimate(c.report), throughput.fmt_rate(throughput.per_s_in(c.throughput, unit)),
                      rank_text.get(id(c), "-"), *((_found(c),) if find else ()))
    console.print(table)
    if find is not None:
        console.print("[dim]a searched row's peak, step time and rate are the analysis at its answer (at the first "
                      "value tried when none fits)[/dim]")
        for c in order:
            if getattr(c, "search", None) is not None:
                console.print(escape(f"{label(c.choice)}: {_proof(c)}"))
    for c in order:
        if c.error:
            kind = "failed" if getattr(c, "status", "") == "failed" else "error"
            console.print(f"[red]{kind}[/red] {escape(row_label(c))}: {escape(c.error)}")
    done = [c for c in cells if c.report is not None]
    # one line per distinct target (rows may differ in GPU or device count)
    for t in dict.fromkeys(c.report.target for c in done):
        console.print(f"[dim]{t.description}, {t.devices} devices; usable {fmt_bytes(t.usable_bytes)} "
                      f"({t.usable_note})[/dim]")
    console.print("[dim]step (est., band): an estimated step time and its band (the spread of the measured "
                  "rates it rests on); jaxmem analyze prints the parts and rule[/dim]")
    what = ("tokens (batch x sequence)" if unit == "tokens" else "samples (the global batch)")
    console.print(f"[dim]{unit}/s/device: the {what} a step trains on, per second at the estimated step time, "
                  f"per device; rank: the rows that fit, highest {unit}/s/device first, =k where its band overlaps "
                  "row k's (tied: their order is not known); a row that does not fit is not ranked[/dim]")


def render_advice(a, console: Console | None = None) -> None:
    """`jaxmem advise`: the compiled plans that fit on the GPUs as given, those that need more GPUs, those that
    do not fit -- three lists, each titled -- and each fitting plan's command, pasted as it runs."""
    console = console or make_console()
    o = a.original.report
    t = o.target
    verdict = {"fits": "fits", "tight": f"is tight (fits at the low end of {tight_text(o)})"}.get(
        verdict_of(o) or "", "does not fit")
    console.print(Text.assemble(("jaxmem advise ", "bold"), (o.model, "bold cyan"),
                                f"  on {t.devices} x {t.description} ({t.gpu})"))
    console.print(f"as given: peak {fmt_bytes(o.per_device_peak_bytes)} per device, usable {fmt_bytes(t.usable_bytes)} "
                  f"({t.usable_note}): it {verdict}; step time (estimate) {_step_estimate(o)}")
    if not a.searched:
        console.print("It fits as given: nothing to change. (--all searches anyway, for faster or roomier settings.)")
        return
    ranks, n = a.ranks(), 0
    gpus = f"{t.devices} GPU" + ("s" if t.devices != 1 else "")
    more = "plans that fit only with more GPUs (each names the GPUs it needs), highest throughput per device first"
    for rows, title in ((a.fitting_here, f"plans that fit on the {gpus} as given, highest throughput per device first"),
                        (a.fitting_more, more)):
        if rows:
            console.print(_advice_table(a, rows, title, ranks, n))
            n += len(rows)
    if a.fitting:
        if any(w.kind == "schedule_memory_limited" for w in o.warnings):
            console.print("[dim]vs as given: the step as given is over XLA's scheduler memory limit, so its "
                          "collectives run beside no compute (schedule_memory_limited): a change under the limit "
                          "can be faster although it recomputes.[/dim]", soft_wrap=True)
        console.print("each plan's command (a memory fraction is set in front of it, as in the training's "
                      "environment):")
        for i, c in enumerate(a.fitting, 1):
            console.print(f"{i:>2}  {escape(c.command(a.path))}", soft_wrap=True)
    elif o.fits:   # --all: the verdict is the step as given; say what the search found, never NONE FITS
        tried = len(a.candidates)
        what = ("no change of the kinds asked (--changes) applies to this step, so none was tried" if not tried else
                f"none of the {tried} changes tried compiled" if not a.compiled else
                f"none of the {len(a.compiled)} compiled changes fits")
        console.print(f"It fits as given; {what}: keep the step as given.")
    elif not a.compiled:
        console.print(Text(" NONE FITS ", style="bold white on red"),
                      f" no change was compiled ({len(a.candidates)} tried, none compiled: see below)")
    else:
        console.print(Text(" NONE FITS ", style="bold white on red"),
                      f" none of the {len(a.compiled)} compiled changes fits")
        c = a.closest
        if c is not None:
            console.print(f"closest: {escape(c.label)}: peak {fmt_bytes(c.peak)}, {fmt_bytes(-c.headroom)} over; "
                          "more devices, a smaller global batch or a smaller model are left", soft_wrap=True)
            console.print(f"    {escape(c.command(a.path))}", soft_wrap=True)
    if a.not_fitting:
        table = Table(title="compiled plans that do not fit (smallest peak first)", title_justify="left")
        for col in ("plan", "peak", "over by"):
            table.add_column(col, justify="left" if col == "plan" else "right")
        for c in sorted(a.not_fitting, key=lambda c: c.peak or 0):
            table.add_row(escape(c.label), fmt_bytes(c.peak), fmt_bytes(-(c.headroom or 0)))
        console.print(table)
    for c in (c for c in a.candidates if c.report is None):
        if c.status == "not_applicable":   # the error says "not applicable: why"
            console.print(f"[dim]{escape(c.label)}: {escape(c.error or '')}[/dim]", soft_wrap=True)
        else:
            console.print(f"[dim]not compiled ({c.status}): {escape(c.label)}: {escape(c.error or '')}[/dim]")
    console.print(f"[dim]{a.compiles} compiles ({a.cached} from the cache) in {a.seconds:.0f} s; {a.progress}. "
                  "Step times are estimates with a band (the spread of the measured rates they rest on); rows whose "
                  "bands overlap are tied: their order is not known (jaxmem analyze prints the parts).[/dim]")


def _advice_table(a, rows, title: str, ranks: dict, start: int) -> Table:
    table = Table(title=title, title_justify="left")
    unit = next((tp[1] for c in rows if (tp := c.throughput) is not None), "tokens/s")
    just: JustifyMethod
    for col, just in (("#", "right"), ("change", "left"), ("peak", "right"), ("headroom", "right"),
                      (f"{unit}/device", "right"), ("step (est., band)", "right"), ("vs as given", "right"),
                      ("GPU-s/step", "right")):
        table.add_column(col, justify=just)
    for i, c in enumerate(rows, 1):
        rel, gs, tp = a.relative(c), c.gpu_seconds, c.throughput
        tight = (f" [yellow]tight[/yellow] ({escape(tight_text(c.report))})" if verdict_of(c.report) == "tight"
                 else "")
        rank = ranks[id(c)]
        tie = "" if rank == i else f" [yellow]tied with #{start + rank}[/yellow]"
        table.add_row(str(start + i) if rank == i else f"={start + rank}", escape(c.label) + tie, fmt_bytes(c.peak),
                      fmt_bytes(c.headroom) + tight, "-" if tp is None else f"{tp[0]:,.0f}",
                      _step_estimate(c.report), "-" if rel is None else f"x{rel:.2f}",
                      "-" if gs is None else fmt_seconds(gs))
    return table
