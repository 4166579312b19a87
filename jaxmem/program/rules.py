"""Logical-axis rules: which mesh axes split each named dimension of a parameter or an activation.

A rule is ``[logical_name, mesh_axis | [mesh_axes] | null]``, the format of MaxText's
``logical_axis_rules``. As in flax's ``logical_to_mesh_axes``, a name may have several rules; for
each leaf the rules are tried in order and a rule applies when the leaf has a dimension of that
name still unassigned and none of the rule's mesh axes is used yet in the leaf's spec. ``null``
(or ``[]``) keeps the dimension whole on purpose.

jaxmem's four layouts are rule sets (:func:`rule_set`): the experts dimension over the expert
axis (always); under ``tp``/``fsdp_tp`` the Megatron names over the tensor axis; under
``fsdp``/``fsdp_tp`` ``embed``, then ``mlp``, then ``vocab`` over the state axes (the fsdp axes,
else the data axes); ``layers`` (a scan axis) never split. Then the fallback for dimensions no
rule named: under the tp layouts, an unannotated leaf of rank 2+ split on its largest dimension the
tensor axis divides; under the fsdp layouts, any leaf the state axes have not split yet, on its
largest free dimension they divide. A user's rules (``--rules FILE``) come before all of these.

Rules name mesh axes. A name the mesh has is that axis; a role's alias (``model`` for a mesh
whose tensor axis is ``tensor``) is the mesh's axis of that role; any other name, or an axis of
size 1, is absent (MaxText's mesh carries every axis, most of size 1): a rule whose axes are all
absent is skipped, so one rules file serves many meshes. A rule only splits a dimension its axes
divide; one that cannot is reported (a :class:`~jaxmem.program.layouts.ShardingIssue`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any, Literal

from jaxmem import files
from jaxmem.errors import UserError
from jaxmem.program import conventions
from jaxmem.program.layouts import (
    ROLE_OF,
    MeshSpec,
    ShardingIssue,
    spec_axes,
    used_axes,
)
from jaxmem.program.options import UNMAPPED

# jaxmem's rules, over axis *roles*: "state" is the axes the fsdp layouts shard the state over
# (MeshSpec.state_axes), "batch" the axes that split the batch; the others a role's one axis.
EXPERT_NAMES = ("exp", "expert", "experts")
TENSOR_NAMES = ("mlp", "heads", "q_heads", "kv_heads", "vocab")   # Megatron: column-parallel dims
FSDP_NAMES = ("embed", "mlp", "vocab")                           # the dim FSDP splits, by preference
# activations: the common names and MaxText's
ACT_EXPERT = EXPERT_NAMES + ("activation_exp",)
ACT_BATCH = ("batch", "activation_batch", "activation_embed_and_logits_batch", "activation_batch_attn",
             "activation_kv_batch", "activation_batch_moe")
ACT_LENGTH = ("length", "seq", "activation_length", "activation_q_length", "activation_length_attn",
              "activation_length_moe")
ACT_TENSOR = ("activation_mlp", "activation_heads", "activation_kv_heads", "activation_vocab", "activation_mlp_moe")
WHOLE_NAMES = ("layers", "head_dim")   # never split: the scan axis; a head's features (MaxText's kv_head_dim)
SMALL = 1 << 16   # leaves below 64 KiB that nothing divides (biases, norm scales) are replicated silently
# every name jaxmem's own rules map (under some layout): a convention does not override them
JAXMEM_NAMES = frozenset(EXPERT_NAMES + TENSOR_NAMES + FSDP_NAMES + ACT_EXPERT + ACT_BATCH + ACT_LENGTH + ACT_TENSOR
                         + WHOLE_NAMES)
ALIASES = conventions.aliases(JAXMEM_NAMES)   # jaxmem name | None -> the convention names that act as it


def _with_aliases(names: Sequence[str]) -> tuple[str, ...]:
    """`names`, each followed by the convention names that act as it (conventions.py)."""
    return tuple(x for n in names for x in (n, *ALIASES.get(n, ())))


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str                        # the logical axis name
    axes: tuple[str, ...] | None     # mesh axes as written; None: kept whole on purpose
    origin: str = "jaxmem"           # where it was written, for messages: "rules.json rule 3"


@dataclasses.dataclass(frozen=True)
class RuleSet:
    """A layout's rules (and the user's before them) resolved against one mesh."""

    params: tuple[tuple[str, tuple[str, ...] | None], ...]   # (name, mesh axes of size > 1 | None)
    fallback: tuple[tuple[tuple[str, ...], bool], ...]       # (axes, unannotated leaves only), in order
    activations: tuple[tuple[str, Any], ...]                 # flax logical_axis_rules
    tensor_names: tuple[str, ...] = ()                       # the names the tp layouts split (reports)
    # where each name with a rule comes from: (name, "user" | "model" | "default", what: the rules file's rule,
    # Workload.axis_rules, jaxmem, or a convention's citation); the first of a name decides
    origins: tuple[tuple[str, str, str], ...] = ()
    # Explicit sharding (--axis-types explicit): a leaf's metadata names mesh axes, not logical
    # names (nnx.Param(..., out_sharding=P("fsdp", None))); those entries are placed as written.
    as_written: bool = False


_FREE = object()   # a spec entry no rule has assigned yet


def _resolve(axes: tuple[str, ...] | None, mesh: MeshSpec, rule: Rule | None = None
             ) -> tuple[str, ...] | Literal[False] | None:
    """A rule's axes on `mesh`: present axes of size > 1 (aliases to the mesh's axis of that role),
    None for a rule that keeps the dim whole, False when every axis it names is absent. Two names
    of one mesh axis (`tensor` and its alias `model`) are the user's mistake, as one name twice is
    (parse): a dimension is split over an axis at most once."""
    if axes is None or not axes:
        return None
    out: list[str] = []
    seen: dict[str, str] = {}
    for a in axes:
        name = mesh.resolve_name(a)
        if name is not None and name in seen and rule is not None:
            raise UserError(f"--rules {rule.origin} {json.dumps([rule.name, list(axes)])}: names the axis {name} "
                            f"twice ({seen[name]} and {a} are both the mesh's {name} axis); a dimension is split "
                            "over an axis at most once")
        if name is not None:
            seen[name] = a
        if name is not None and mesh.axis_size(name) > 1 and name not in out:
            out.append(name)
    return tuple(out) or False


def rule_set(layout: str, mesh: MeshSpec, user: Sequence[Rule] = (), workload_rules=()) -> RuleSet:
    """The rules a layout applies on `mesh`: `user` rules first, then jaxmem's (module docstring).

    `workload_rules` (Workload.axis_rules) are extra rules for the tp layouts: a name mapped to the
    tensor axis is split over it before jaxmem's names, a name mapped to anything else is not."""
    tensor = mesh.model_axis
    mentioned = {logical for logical, _ in workload_rules}
    named = [logical for logical, axis in workload_rules
             if axis is not None and (axis == tensor or (mesh.role(axis) if axis in mesh.names
                                                         else ROLE_OF.get(axis)) == "tensor")]
    named += [n for n in TENSOR_NAMES if n not in mentioned]
    tp_names: tuple[str, ...] = tuple(named) if layout in ("tp", "fsdp_tp") and tensor else ()
    state = mesh.state_axes if layout in ("fsdp", "fsdp_tp") else ()
    builtin: list[tuple[str, tuple[str, ...] | None]] = [(n, mesh.with_role("expert"))
                                                         for n in _with_aliases(EXPERT_NAMES)]
    builtin += [(n, (tensor,)) for n in _with_aliases(tp_names) if tensor]
    builtin += [(n, state) for n in _with_aliases(FSDP_NAMES) if state]
    params: list[tuple[str, tuple[str, ...] | None]] = []
    for r in user:
        axes = _resolve(r.axes, mesh, r)
        if axes is not False:
            params.append((r.name, axes))
    for name, wanted in builtin:
        present = tuple(a for a in wanted or () if a and mesh.axis_size(a) > 1)
        if present:
            params.append((name, present))
    # the scan axis (one layer's slice per iteration), a head's features, and the conventions' whole names
    params += [(n, None) for n in WHOLE_NAMES + ALIASES.get(None, ())]
    # a group of size 1 splits nothing: no fallback (and no issue) for it
    fallback: list[tuple[tuple[str, ...], bool]] = []
    if tp_names and tensor and mesh.axis_size(tensor) > 1:
        fallback.append(((tensor,), True))
    if state and mesh.axis_size(state) > 1:
        fallback.append((state, False))
    return RuleSet(tuple(params), tuple(fallback), activation_rules(mesh, user, tp_names), tp_names,
                   origins=_origins(user, workload_rules))


def _origins(user: Sequence[Rule], workload_rules) -> tuple[tuple[str, str, str], ...]:
    """(name, source, what) of every name a rule maps: the user's, the workload's, jaxmem's, the conventions'."""
    out = [(r.name, "user", f"--rules {r.origin}") for r in user]
    out += [(str(name), "model", "Workload.axis_rules") for name, _ in workload_rules]
    out += [(n, "default", "jaxmem") for n in sorted(JAXMEM_NAMES)]
    out += [(n, "default", f"{conv.name}: {conv.citation}") for n, (conv, _, _) in
            conventions.table(JAXMEM_NAMES).items()]
    return tuple(out)


def activation_rules(mesh: MeshSpec, user: Sequence[Rule], tp_names: Sequence[str]) -> tuple:
    """flax logical_axis_rules for the activations the model constrains (nn.with_logical_constraint):
    the user's first; the experts dim over the expert axis (before the batch, which then takes the
    other batch axes); the batch over the batch axes; the sequence over the context axis; under the
    tp layouts the Megatron names over the tensor axis."""
    rules: list[tuple[str, Any]] = []
    for r in user:
        axes = _resolve(r.axes, mesh)
        if axes is not False:
            rules.append((r.name, None if axes is None else spec_axes(axes)))
    expert = mesh.axis_of("expert")
    if expert:
        rules += [(n, expert) for n in _with_aliases(ACT_EXPERT)]
    batch = mesh.batch_axes
    act_batch = ACT_BATCH + ALIASES.get("batch", ())
    rules += [(n, spec_axes(batch) if batch else None) for n in act_batch]
    rest = tuple(a for a in batch if a != expert)
    if expert and rest:
        rules += [(n, spec_axes(rest)) for n in act_batch]
    if mesh.context_axis:
        rules += [(n, mesh.context_axis) for n in ACT_LENGTH + ALIASES.get("length", ())]
    if tp_names:
        rules += [(n, mesh.model_axis) for n in _with_aliases(tuple(tp_names) + ACT_TENSOR)]
    # kept whole on purpose: flax's default for a name without a rule, written so that it is a rule
    rules += [(n, None) for n in WHOLE_NAMES + ALIASES.get(None, ()) + ALIASES.get("embed", ())]
    return tuple(rules)


def leaf_spec(path: str, shape: tuple[int, ...], itemsize: int, names: Sequence[str | None] | None, rules: RuleSet,
              mesh: MeshSpec, issues: list[ShardingIssue]) -> tuple:
    """The PartitionSpec entries (one per dim) of one state leaf under `rules`."""
    if not shape:
        return ()
    spec: list[Any] = [_FREE] * len(shape)
    nbytes = math.prod(shape) * itemsize
    names = tuple(names) if names is not None and len(names) == len(shape) else None
    def used() -> set[str]:
        return set(used_axes([s for s in spec if s is not _FREE]))

    failed = []
    if names and rules.as_written:
        for i, name in enumerate(names):
            written: tuple[str, ...] = (tuple(name) if isinstance(name, (tuple, list))
                                        else (name,) if name is not None else ())
            if written and all(a in mesh.names for a in written):
                spec[i] = spec_axes(written)
    if names and not rules.as_written and _names_mesh_axes(names, rules, mesh):
        return _as_written(path, shape, nbytes, names, mesh, issues)
    if names:
        for name, axes in rules.params:
            dims = [i for i, n in enumerate(names) if n == name and spec[i] is _FREE]
            if not dims:
                continue
            if axes is None:
                spec[dims[0]] = None
                continue
            if used() & set(axes):
                continue
            size = mesh.axis_size(axes)
            fits = [i for i in dims if shape[i] % size == 0]
            if fits:
                spec[fits[0]] = spec_axes(axes)
            else:
                failed.append((dims[0], name, axes, size))
    late: list[ShardingIssue] = []
    reported: set[tuple[str, ...]] = set()
    for axes, unannotated_only in rules.fallback:
        if (unannotated_only and (names is not None or len(shape) < 2)) or used() & set(axes):
            continue
        size = mesh.axis_size(axes)
        left = nbytes // mesh.axis_size(tuple(used()))
        free = [i for i in range(len(shape)) if spec[i] is _FREE and not (names and names[i] == "layers")]
        candidates = [i for i in free if shape[i] % size == 0]
        if candidates:
            best = max(candidates, key=lambda i: (shape[i], i))
            spec[best] = spec_axes(axes)
            if names is None and len(shape) >= 2 and left >= SMALL:
                _poor(path, shape, free, best, axes, size, issues)
            continue
        reported.add(axes)
        if left >= SMALL:  # biases and norm scales are replicated by every FSDP implementation
            late.append(ShardingIssue(path, shape, "+".join(axes), f"no dimension of {shape} is divisible by {size}",
                                      left - left // size))
    for i, name, axes, size in failed:
        named_taken = any(n == name and s is not _FREE for n, s in zip(names or (), spec, strict=False))
        if used() & set(axes) or axes in reported or named_taken:
            continue
        reported.add(axes)
        issues.append(ShardingIssue(path, shape, "+".join(axes), f"dim {i} ({name}={shape[i]}) not divisible by "
                                    f"{'x'.join(axes)}={size}", nbytes - nbytes // size))
    issues.extend(late)
    return tuple(None if s is _FREE else s for s in spec)


def padded(n: int, size: int) -> int:
    """`n` rounded up to a multiple of 64 and of `size` x 8 (nanoGPT pads GPT-2's 50257 to 50304)."""
    step = math.lcm(64, 8 * size)
    return -(-n // step) * step


def _poor(path: str, shape: tuple[int, ...], free: list[int], best: int, axes: tuple[str, ...], size: int,
          issues: list[ShardingIssue]) -> None:
    """A fallback split on `best` while the leaf's largest free dimension does not divide (a vocabulary of
    50257 rows under 8 devices: the embedding split on its hidden size) is reported with the padding that
    lets the rows split."""
    largest = max(free, key=lambda i: (shape[i], -i))
    if largest == best or shape[largest] % size == 0 or shape[largest] <= shape[best]:
        return
    to = padded(shape[largest], size)
    issues.append(ShardingIssue(
        path, shape, "+".join(axes), f"split on dim {best} ({shape[best]}), not its largest dim {largest} "
        f"({shape[largest]}: not divisible by {'x'.join(axes)}={size}); padding it to {to} lets the rows split",
        0, kind="poor_dimension", split_dim=best, padded_to=to))


def _entry(name) -> tuple[str, ...]:
    return tuple(name) if isinstance(name, (tuple, list)) else (name,) if name is not None else ()


def _names_mesh_axes(names: Sequence[Any], rules: RuleSet, mesh: MeshSpec) -> bool:
    """The leaf's annotation names mesh axes (tunix's nnx.Param(..., sharding=('fsdp', 'tp'))), not
    logical names: an axis of the mesh, or a role's name (`tp` on a mesh without that axis: one of size
    1 in the model's own mesh), and no rule maps it."""
    mapped = {n for n, _ in rules.params}
    entries = [_entry(n) for n in names if n is not None]
    return bool(entries) and any(a in mesh.names for e in entries for a in e) and all(
        a not in mapped and (a in mesh.names or a in ROLE_OF) for e in entries for a in e)


def _as_written(path: str, shape: tuple[int, ...], nbytes: int, names: Sequence[Any], mesh: MeshSpec,
                issues: list[ShardingIssue]) -> tuple:
    """A leaf annotated with mesh axes: its spec as written (its trainer's), each name the mesh's
    axis of that name or role; an absent axis or one of size 1 splits nothing, and an axis that does
    not divide its dimension leaves it whole (reported)."""
    spec: list[Any] = []
    used: set[str] = set()
    for i, name in enumerate(names):
        axes = tuple(a for a in (mesh.resolve_name(n) for n in _entry(name))
                     if a is not None and mesh.axis_size(a) > 1 and a not in used)
        size = mesh.axis_size(axes)
        if axes and shape[i] % size:
            issues.append(ShardingIssue(path, shape, "+".join(axes), f"dim {i} ({shape[i]}) of the annotation "
                                        f"{tuple(names)} not divisible by {'x'.join(axes)}={size}",
                                        nbytes - nbytes // size))
            axes = ()
        used.update(axes)
        spec.append(spec_axes(axes) if axes else None)
    return tuple(spec)


# ------------------------------------------------------------------ the names a model uses

MAX_PLACES = 3   # places listed per name (where it is used)


def origin(rules: RuleSet, name: str, mesh: MeshSpec) -> tuple[str, str] | None:
    """(source, what) of the rule that maps `name`: user | model | default (jaxmem's or a convention's);
    a mesh axis's name (tunix's, EasyDeL's annotations) is the model's own placement; None: no rule maps it."""
    for n, source, what in rules.origins:
        if n == name:
            return source, what
    if name in mesh.names or name in ROLE_OF:
        return "model", "a mesh axis named in the model's annotation (placed as written)"
    return None


def mesh_axes_of(rules: RuleSet, name: str) -> list[str]:
    """The mesh axes `name` is split over on this mesh and layout ([]: kept whole): its first parameter rule,
    else its first activation rule."""
    for n, axes in rules.params:
        if n == name:
            return list(axes or ())
    for n, spec in rules.activations:
        if n == name:
            return [] if spec is None else [spec] if isinstance(spec, str) else list(spec)
    return []


def logical_rules(used: dict[str, list[str]], rules: RuleSet, mesh: MeshSpec, unmapped: str = "error") -> list[dict]:
    """The report's `choices.logical_rules`: every logical name the model uses, the mesh axes it is split
    over, the rule's source and where that rule comes from, and where the model uses the name."""
    out = []
    for name in sorted(used):
        found = origin(rules, name, mesh)
        source, what = found if found else ("user", f"--unmapped {unmapped}: no rule maps it, replicated")
        axes = [] if found is None else [a for a in (mesh.resolve_name(name),) if a] if found[1].startswith(
            "a mesh axis") else mesh_axes_of(rules, name)
        out.append({"name": name, "mesh_axes": axes, "source": source, "convention": what,
                    "used_at": list(used[name][:MAX_PLACES])})
    return out


def check_unmapped(used: dict[str, list[str]], rules: RuleSet, mesh: MeshSpec, unmapped: str = "error") -> None:
    """No logical name is replicated silently: a name no rule maps (--rules, jaxmem's, a known convention's)
    is a UserError listing each with where it is used and the --rules lines that would map it, unless the
    user accepts replication (--unmapped replicate)."""
    if unmapped not in UNMAPPED:
        raise UserError(f"--unmapped {unmapped}: expected one of {', '.join(UNMAPPED)}")
    missing = {n: w for n, w in sorted(used.items()) if origin(rules, n, mesh) is None}
    if not missing or unmapped == "replicate":
        return
    lines = [f"  {name}: used at {'; '.join(where[:MAX_PLACES])}" + (f" (and {len(where) - MAX_PLACES} more)"
                                                                     if len(where) > MAX_PLACES else "")
             for name, where in missing.items()]
    suggested = ", ".join(json.dumps([n, _suggest(n, mesh)]) for n in missing)
    mesh_text = ",".join(f"{n}={s}" for n, s in mesh.axes)
    raise UserError(
        f"{len(missing)} logical axis name(s) that no rule maps (not --rules, not jaxmem's, not a known convention "
        "of jaxmem/program/conventions.py): flax would keep every dimension they name whole on every device, "
        "which is rarely what the trainer does:\n" + "\n".join(lines) +
        f"\nGive --rules FILE mapping them, e.g. a rules.json of [{suggested}] (mesh axes of --mesh {mesh_text}; "
        "null keeps the dimension whole on purpose), or accept replication with --unmapped replicate.")


def _suggest(name: str, mesh: MeshSpec) -> Any:
    """A guess at the mesh axes a name means, for the error's example rules (the user checks it)."""
    low = name.lower()
    tensor = mesh.model_axis if mesh.model_axis and mesh.axis_size(mesh.model_axis) > 1 else None
    split = lambda axes: (axes[0] if len(axes) == 1 else list(axes)) if axes else None  # noqa: E731
    if "batch" in low:
        return split(tuple(a for a in mesh.batch_axes if mesh.axis_size(a) > 1))
    if any(k in low for k in ("len", "seq", "pos", "time")):
        return mesh.context_axis if mesh.context_axis and mesh.axis_size(mesh.context_axis) > 1 else None
    if any(k in low for k in ("head", "mlp", "ff", "hidden", "vocab")) and tensor:
        return tensor
    if any(k in low for k in ("emb", "model", "width", "mlp", "ff", "hidden", "vocab")):
        return split(tuple(a for a in mesh.state_axes if mesh.axis_size(a) > 1))
    if "exp" in low:
        return mesh.axis_of("expert")
    return None


# ------------------------------------------------------------------ rules files


MAX_RULES_BYTES = 16 << 20   # MaxText's largest configs are tens of kB


def load(path: str) -> tuple[tuple[Rule, ...], str]:
    """The rules of a file (JSON or YAML: a list of rules, or a mapping with `logical_axis_rules`,
    e.g. a MaxText config) and the sha256 of its content. Errors name the file and the rule."""
    data = files.read_user_file(path, MAX_RULES_BYTES, "--rules", "give a JSON or YAML file of rules")
    text = data.decode("utf-8", errors="replace")
    return parse(text, os.path.basename(path)), hashlib.sha256(data).hexdigest()


def digest(path: str | None) -> str | None:
    """The sha256 of a rules file's content (None without one, or when it cannot be read: load says why)."""
    if not path:
        return None
    try:   # bounded and non-blocking, as load reads it (a FIFO here once hung forever)
        return hashlib.sha256(files.read_regular(path, MAX_RULES_BYTES)).hexdigest()
    except (OSError, files.Refused):
        return None


def parse(text: str, source: str) -> tuple[Rule, ...]:
    try:
        doc = files.loads_json(text, f"--rules {source}")
    except ValueError:
        doc = _yaml(text, source)
        files.check_tree(doc, f"--rules {source}")
    if isinstance(doc, dict):
        if "logical_axis_rules" not in doc:
            raise UserError(f"--rules {source}: a mapping without a `logical_axis_rules` key; give a list of "
                            "[logical_name, mesh_axis | [mesh_axes]] rules, or a config that has that key")
        doc = doc["logical_axis_rules"]
    if not isinstance(doc, list):
        raise UserError(f"--rules {source}: expected a list of [logical_name, mesh_axis | [mesh_axes]] rules, got "
                        f"a {type(doc).__name__}")
    return tuple(_rule(r, f"{source} rule {i + 1}") for i, r in enumerate(doc))


def _rule(r, origin: str) -> Rule:
    shape = "expected [logical_name, mesh_axis | [mesh_axes] | null], e.g. [\"embed\", \"fsdp\"]"
    if not isinstance(r, (list, tuple)) or len(r) != 2 or not isinstance(r[0], str) or not r[0]:
        raise UserError(f"--rules {origin} {json.dumps(r)}: {shape}")
    name, axes = r
    if axes is None or isinstance(axes, str):
        axes = () if axes is None else (axes,)
    if not isinstance(axes, (list, tuple)) or not all(isinstance(a, str) and re.fullmatch(r"[A-Za-z_]\w*", a)
                                                      for a in axes):
        raise UserError(f"--rules {origin} {json.dumps(r)}: {shape}; mesh axes are names like fsdp or tensor")
    twice = sorted({a for a in axes if list(axes).count(a) > 1})
    if twice:
        raise UserError(f"--rules {origin} {json.dumps(r)}: uses the axis {twice[0]} twice; a dimension is split "
                        "over an axis at most once")
    return Rule(name, tuple(axes) or None, origin)


def _yaml(text: str, source: str):
    try:
        import yaml  # noqa: PLC0415 - optional: PyYAML, only for .yaml rules
    except ImportError:
        return _flow_list(text, source)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"--rules {source}: neither JSON nor YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:   # PyYAML's parser recurses per level
        raise UserError(f"--rules {source}: nested more than {files.MAX_DEPTH} levels deep; a rules file "
                        "nests 3") from None
    except (ValueError, OverflowError) as e:   # an integer of more digits than Python converts, a bad date
        raise UserError(f"--rules {source}: a value YAML cannot convert ({str(e).splitlines()[0][:120]})") from None


def _flow_list(text: str, source: str):
    """Without PyYAML: MaxText's form, `logical_axis_rules: [ [...], ... ]` (comments allowed), or a
    bare list, read as JSON once quotes and comments are normalized."""
    m = re.search(r"^logical_axis_rules:\s*(\[)", text, re.MULTILINE)
    body = text[m.start(1):] if m else text
    lines = [re.sub(r"\s#.*$|^\s*#.*$", "", line) for line in body.splitlines()]
    body, depth, end = "\n".join(lines).replace("'", '"'), 0, None
    for i, ch in enumerate(body):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth == 0 and ch == "]":
            end = i + 1
            break
    try:
        return files.loads_json(re.sub(r",\s*]", "]", body[:end]), f"--rules {source}")
    except (ValueError, TypeError):
        raise UserError(f"--rules {source}: not JSON, and not the YAML list form jaxmem reads without PyYAML "
                        "(install pyyaml for any YAML)") from None
