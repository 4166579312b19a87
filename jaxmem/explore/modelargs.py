"""The model's own arguments (`--arg NAME=VALUE`), each with its type and range, read from the model itself.

A config.json's are the decoder's workload() (jaxmem.hf): sequence length up to int32 with the model's context
(max_position_embeddings) beside it, attention kernel, numerics, vocab_tiles (the chunked loss: it must divide the
sequence), scan, remat_save, and an MoE's routing arguments, with the limits build_workload checks. A model file's
are read from its source without running it (ast): workload()'s parameters, and where it takes ``**overrides``,
the fields of the module's ``Config`` dataclass (the shipped models' convention), each typed by its annotation or
default; a ``PRESETS`` dict names the presets; a text field whose comment quotes two or more values, one of them
its default, offers those values (models/llama.py's ``attention: str = "xla"  # "xla": ...; "cudnn": ...``).

Text arguments are fixed for an explorer (jaxmem.explore.query: a workload may open a path it is given), except a
value from the argument's own closed list (`choices`): no such value can name a file.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import tokenize
from pathlib import Path
from typing import Any

from jaxmem import hf
from jaxmem.errors import UserError
from jaxmem.hf import config as hf_config
from jaxmem.hf import model as hf_model
from jaxmem.program.sizes import INT32_MAX

SEQ_ARG = "seq_len"
# workload() arguments another control of the page already sets (--batch, --remat): listed, not offered twice
VIA = {"batch_size": "batch", "remat": "remat"}
SIZES = ("batch_size", "seq_len", "image_size")   # a model file's sizes: at least 1 (a 0 builds no step)
_QUOTED = re.compile(r'"([A-Za-z0-9_.:-]+)"')


def _arg(name: str, kind: str, default: Any, help_: str, **more: Any) -> dict[str, Any]:
    out = {"name": name, "kind": kind, "default": default, "help": help_, "via": VIA.get(name)}
    out.update({k: v for k, v in more.items() if v is not None})
    return out


def _config_args(path: Path) -> dict[str, Any]:
    arch = hf.load_arch(path)
    ctx = arch.max_positions or None
    learned = arch.positions == "learned"
    seq_default = min(hf.DEFAULT_SEQ_LEN, ctx) if ctx else hf.DEFAULT_SEQ_LEN
    args = [
        _arg("batch_size", "int", hf.DEFAULT_BATCH, "sequences a step (the page's batch sets it)", min=1,
             max=INT32_MAX),
        _arg("seq_len", "int", seq_default, "tokens a sequence", min=1, max=ctx if learned else INT32_MAX,
             context=ctx),
        _arg("attention", "choice", "auto", "the attention kernel: auto is cuDNN flash attention where the card, "
             "dtype and shapes allow it, else XLA's", choices=list(hf.ATTENTION)),
        _arg("numerics", "choice", "default", "default: compute follows the parameters; maxtext: fp32 weights, "
             "bf16 compute", choices=list(hf_model.NUMERICS)),
        _arg("vocab_tiles", "int", 1, "the loss in this many tiles of the sequence, the full logits never live "
             "(a chunked loss); must divide seq_len", min=1, max=INT32_MAX, divides=SEQ_ARG),
        _arg("scan", "bool", True, "the layers under nn.scan (MaxText's program); off: a Python loop, as Hugging "
             "Face's Flax models run them"),
        _arg("remat_save", "names", "", "activations saved on top of the remat policy (comma-separated)",
             choices=list(hf_model.CHECKPOINT_NAMES)),
        _arg("remat", "text", "none", "the remat policy (the page's remat sets it)"),
    ]
    if arch.moe:
        args += [
            _arg("capacity_factor", "float", 1.25, "expert capacity over an even split of the tokens", min=0,
                 exclusive_min=True),
            _arg("group_size", "int", None, "tokens routed together (default: one sequence); must divide seq_len",
                 min=1, divides=SEQ_ARG),
            _arg("aux_loss_coef", "float", 0.01, "the load-balancing loss's weight", min=0),
        ]
    return {"source": "config.json", "args": args, "open": False, "context": ctx,
            "context_field": hf.context_field(arch) if ctx else None, "model_type": arch.model_type}


def _literal(node: ast.expr | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _kind(annotation: str, default: Any) -> str:
    words = set(re.findall(r"[A-Za-z_]+", annotation))
    if isinstance(default, bool) or "bool" in words:
        return "bool"
    if ("int" in words and "float" not in words) or (isinstance(default, int) and not annotation):
        return "int"
    if "float" in words or isinstance(default, float):
        return "float"
    return "text"


def _comments(source: str) -> dict[int, str]:
    """Each line's trailing comment, by line number."""
    out = {}
    try:
        for tok in tokenize.generate_tokens(iter(source.splitlines(keepends=True)).__next__):
            if tok.type == tokenize.COMMENT:
                out[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return out


def _file_arg(name: str, annotation: str, default: Any, help_: str, presets: list[str]) -> dict[str, Any]:
    kind = _kind(annotation, default)
    choices = None
    if name == "preset" and presets:
        kind, choices = "choice", presets
    elif kind == "text":
        quoted = list(dict.fromkeys(_QUOTED.findall(help_)))
        if len(quoted) >= 2 and default in quoted:
            kind, choices = "choice", quoted
    lo = 1 if name in SIZES else None
    return _arg(name, kind, default, help_, choices=choices, min=lo, max=INT32_MAX if lo else None)


def _file_args(path: Path) -> dict[str, Any]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    comments = _comments(source)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "workload"), None)
    presets: list[str] = []
    by_preset: dict[str, dict[str, Any]] = {}   # preset -> the Config fields it sets (Config(d_model=64, ...))
    config: ast.ClassDef | None = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PRESETS" for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            for k, v in zip(node.value.keys, node.value.values, strict=True):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    presets.append(k.value)
                    kws = v.keywords if isinstance(v, ast.Call) else []
                    by_preset[k.value] = {kw.arg: _literal(kw.value) for kw in kws if kw.arg}
        if isinstance(node, ast.ClassDef) and node.name == "Config":
            config = node
    args: list[dict[str, Any]] = []
    if fn is None:
        return {"source": "model file", "args": args, "open": False, "context": None, "context_field": None}
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for arg, d in [*zip(positional, defaults, strict=True), *zip(a.kwonlyargs, a.kw_defaults, strict=True)]:
        ann = ast.unparse(arg.annotation) if arg.annotation is not None else ""
        args.append(_file_arg(arg.arg, ann, _literal(d), comments.get(arg.lineno, ""), presets))
    if a.kwarg is not None and config is not None:   # **overrides: the Config fields (the shipped models' way)
        named = {x["name"] for x in args}
        for st in config.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id not in named:
                name = st.target.id
                field = _file_arg(name, ast.unparse(st.annotation), _literal(st.value), comments.get(st.lineno, ""),
                                  presets)
                # a Config field's value is the preset's: its default is Config's only where a preset leaves it
                field["config_field"] = True
                field["by_preset"] = {p: kw[name] for p, kw in by_preset.items() if name in kw}
                args.append(field)
    return {"source": "model file", "args": args, "open": a.kwarg is not None and config is None,
            "context": None, "context_field": None}


@functools.lru_cache(maxsize=64)
def _cached(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    p = Path(path)
    cfg = hf_config.config_file(p)
    if cfg is not None:
        return _config_args(cfg)
    return _file_args(p)


def of(model: Any) -> dict[str, Any]:
    """The model's arguments: {"source", "args": [{name, kind (int, float, bool, text, choice, names), default,
    help, min, max, choices, context, divides, via}], "open" (a **kwargs no Config names), "context",
    "context_field"}; no arguments where the model cannot be read (its answer says why)."""
    empty: dict[str, Any] = {"source": None, "args": [], "open": False, "context": None, "context_field": None}
    if not isinstance(model, (str, os.PathLike)):
        return empty
    p = Path(model)
    target = hf_config.config_file(p) or p
    try:
        st = target.stat()
        return _cached(str(target), st.st_mtime_ns, st.st_size)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, UserError):
        return empty


def choices(model: Any) -> dict[str, tuple[str, list[str]]]:
    """The text arguments with a closed list of values: name -> (kind: choice | names, the values)."""
    return {a["name"]: (a["kind"], list(a["choices"])) for a in of(model)["args"]
            if a["kind"] in ("choice", "names") and a.get("choices")}


def allowed_text(model: Any, name: str, value: str) -> bool:
    """Whether a text value of the argument `name` is one of its own values (no such value names a file)."""
    kind, values = choices(model).get(name, ("", []))
    if kind == "choice":
        return value in values
    if kind == "names":
        return all(part in values for part in value.split(",") if part) or value == ""
    return False
