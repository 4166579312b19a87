"""/api/controls: every question the CLI can answer, with the values this model and card accept.

Each list is the CLI's own (jaxmem.program.options' constants, the GPU catalogue), so the page offers no
value the API would refuse; `options` describes every parameter /api/answer takes, as analyze's flags do;
`model_args` the model's own arguments with their types and ranges (jaxmem.explore.modelargs: a config.json's
max_position_embeddings as `context`); `schema` the report's vocabulary the page draws with (the breakdown's
keys in order with their help and the HTML report's colours, the verdicts, the warning kinds), so that the page
keeps no copy of any of it.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxmem.compiler.catalogue import CLOUD_HOSTS
from jaxmem.compiler.targets import catalogue_rows
from jaxmem.explore import modelargs, query
from jaxmem.present import html
from jaxmem.program import layouts
from jaxmem.program.options import (
    BASE_DTYPES,
    LAYOUTS,
    OFFLOADS,
    OPTIMIZER_NAMES,
    PIPELINES,
    PRECISIONS,
    REMAT_POLICIES,
)
from jaxmem.report import BREAKDOWN_HELP, BREAKDOWN_KEYS, VERDICT_TEXT, WARNING_KINDS

if TYPE_CHECKING:
    from jaxmem.explore.points import Explorer

SEQ_ARG = "seq_len"   # the sequence length's argument in the shipped models and in a config.json's workload
DEVICE_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LORA_RANKS = (0, 4, 8, 16, 32, 64, 128)
ACCUM = (1, 2, 4, 8, 16)
STAGES = (1, 2, 4, 8)


def seq_arg_of(model) -> str | None:
    """The workload argument that sets the sequence length (None when the model takes none): a config.json
    (or its folder) takes seq_len; a model file when its workload() names it (read with ast: not run)."""
    if not isinstance(model, (str, os.PathLike)):
        return None
    path = Path(model)
    if path.is_dir() or path.suffix == ".json":
        return SEQ_ARG
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "workload":
            names = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
            return SEQ_ARG if SEQ_ARG in names else None
    return None


def mesh_presets(n: int) -> list[dict[str, str]]:
    """The common layouts of `n` devices: replicas, FSDP, HSDP over hosts of 8, FSDP with a tensor axis."""
    out = [{"label": "DP", "mesh": f"data={n}", "layout": "dp"},
           {"label": "FSDP", "mesh": f"fsdp={n}", "layout": "fsdp"}]
    if n > 8 and n % 8 == 0:
        out.append({"label": "HSDP", "mesh": f"data={n // 8},fsdp=8", "layout": "fsdp"})
    for k in (2, 4, 8):
        if n % k == 0 and n > k:
            out.append({"label": f"FSDP+TP{k}", "mesh": f"fsdp={n // k},tensor={k}", "layout": "fsdp_tp"})
    if n > 1:
        out.append({"label": "TP", "mesh": f"tensor={n}", "layout": "tp"})
    return out


def schema() -> dict[str, Any]:
    """The report's vocabulary, as the renderers use it: each breakdown key in display order with its help and
    colour (the HTML report's), the colours of the buffer categories and the fallback for a key the page does
    not know, the verdicts' words, the warning kinds."""
    return {
        "breakdown": [{"key": k, "label": k.replace("_", " "), "help": BREAKDOWN_HELP.get(k, ""),
                       "color": html._color(k, i)} for i, k in enumerate(BREAKDOWN_KEYS)],
        "colors": dict(html.COLORS),
        "fallback_colors": list(html._FALLBACK),
        "verdicts": dict(VERDICT_TEXT),
        "warning_kinds": dict(WARNING_KINDS),
    }


def params_of(rep) -> dict[str, int | None] | None:
    """The parameter counts of a compiled point: total, trainable, frozen (None before it compiled)."""
    if rep is None:
        return None
    return {"total": rep.param_count, "trainable": rep.trainable_param_count, "frozen": rep.frozen_param_count}


def _option(name: str) -> dict[str, Any]:
    f, flag = query.FLAGS[name]
    default = f.default
    if flag.kind == "switch":
        default = False
    return {"name": name, "kind": flag.kind, "choices": list(flag.choices), "default": default,
            "help": flag.help, "pinned": f.name in query.PINNED}


def controls(ex: Explorer) -> dict[str, Any]:
    start = ex.start
    try:
        spec = layouts.parse_mesh(start.mesh, start.axis_roles)
        n, data = spec.size, spec.data_size
    except Exception:  # noqa: BLE001 -- the start was checked; a mesh the roles cannot read still gets controls
        n, data = 1, 1
    first = ex.point(start)
    rep = first.report
    batch = rep.options.get("batch") if rep is not None else start.batch
    seq = None
    if ex.seq_arg:
        given = dict(start.model_args).get(ex.seq_arg)
        seq = given if isinstance(given, int) else (rep.sequence_length if rep is not None else None)
    rows = catalogue_rows()
    cloud = {h.key for h in CLOUD_HOSTS}
    gpus = [{"name": r["name"], "description": r["description"], "memory_bytes": r["memory_bytes"],
             "fp8": bool((r.get("performance") or {}).get("fp8_flops")), "cloud": r["name"] in cloud,
             "default": bool(r.get("default"))} for r in rows]
    gpus.sort(key=lambda g: g["cloud"])   # the cards first, the cloud machine types after (stable order)
    margs = modelargs.of(ex.model)
    return {
        "model": str(ex.model),
        "generation": ex.generation,
        "model_args": margs,
        "context": None if not margs["context"] else {"tokens": margs["context"], "field": margs["context_field"],
                                                      "arg": SEQ_ARG},
        "params": params_of(rep),
        "schema": schema(),
        "start": first.query,
        "seq_arg": ex.seq_arg,
        "gpus": gpus,
        "fp8_gpus": [g["name"] for g in gpus if g["fp8"]],
        "device_counts": list(DEVICE_COUNTS),
        "mesh_roles": list(layouts.ROLES),
        "mesh_presets": mesh_presets(n),
        "layouts": list(LAYOUTS),
        "remat": list(REMAT_POLICIES),
        "precisions": list(PRECISIONS),
        "optimizers": list(OPTIMIZER_NAMES),
        "base_dtypes": list(BASE_DTYPES),
        "offloads": list(OFFLOADS),
        "pipelines": list(PIPELINES),
        "lora_ranks": list(LORA_RANKS),
        "accum": list(ACCUM),
        "stages": list(STAGES),
        "batch": {"value": batch, "granule": max(1, data * start.accum)},
        "seq": None if not ex.seq_arg else {"arg": ex.seq_arg, "value": seq},
        "options": [_option(name) for name in query.FLAGS],
    }
