"""The optimized HLO text of a compiled program (``compiled.as_text()``), read structurally.

``compiled.as_text()`` is the program XLA will run, after SPMD partitioning and
fusion: per device, with its collectives and its loops. This module splits it into
computations and instructions, follows the call graph, and says how many times each
computation runs per step: a ``while`` body runs its loop's trip count times (XLA
writes the count it proved into the loop's ``backend_config`` as
``known_trip_count``; a scanned model's layer loop is one), so an instruction inside
the layer loop of a 32-layer model runs 32 times per step.

Only what the step-time estimate and the collective census need is parsed: names,
result shapes, opcodes, attributes and called computations.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import defaultdict
from functools import cached_property

# Bytes per element of XLA's primitive types (sub-byte types packed).
DTYPE_BYTES = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
    "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16, "tf32": 4,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e3m4": 1, "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1,
    "f8e8m0fnu": 1, "f4e2m1fn": 0.5, "token": 0,
}

_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s+->\s+.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s+=\s+")
_CALLED = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_CALLED_LIST = re.compile(r"\b(branch_computations|called_computations)=\{([^}]*)\}")
_OPCODE = re.compile(r"([a-z][\w\-]*)\(")
_COMMENT = re.compile(r"/\*.*?\*/")
_STACK_FRAME = re.compile(r"\s*stack_frame_id=\d+")


@dataclasses.dataclass(frozen=True)
class Array:
    dtype: str
    dims: tuple[int, ...]

    @property
    def bytes(self) -> int:
        return math.ceil(math.prod(self.dims) * DTYPE_BYTES.get(self.dtype, 4))


def parse_shape(text: str):
    """An HLO shape: an :class:`Array` or a (nested) tuple of them."""
    text = _COMMENT.sub("", text).strip()
    shape, _ = _parse_shape(text, 0)
    return shape


def _parse_shape(text: str, i: int):
    while i < len(text) and text[i] == " ":
        i += 1
    if text.startswith("(", i):
        items: list = []
        i += 1
        while True:
            while i < len(text) and text[i] in " ,":
                i += 1
            if i >= len(text) or text[i] == ")":
                return tuple(items), i + 1
            item, i = _parse_shape(text, i)
            items.append(item)
    m = _ARRAY.match(text, i)
    if not m:
        raise ValueError(f"not an HLO shape at {text[i:i + 40]!r}")
    dims = tuple(int(d) for d in m.group(2).split(",") if d)
    return Array(m.group(1), dims), m.end()


def shape_bytes(shape) -> int:
    if isinstance(shape, Array):
        return shape.bytes
    return sum(shape_bytes(s) for s in shape)


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape_text: str      # the result shape as printed
    opcode: str
    operands: str        # the operand list as printed
    attrs: str           # everything after the operand list
    computation: str     # the computation it belongs to

    @cached_property
    def shape(self):
        return parse_shape(self.shape_text)

    @cached_property
    def operand_names(self) -> list[str]:
        """The instructions it reads, by name, in order."""
        return re.findall(r"%([\w.\-]+)", self.operands)

    @cached_property
    def called(self) -> tuple[tuple[str, str], ...]:
        """(attribute, computation) for every computation this instruction calls."""
        a = self.attrs
        # most instructions call nothing: skip the regexes (these substrings are in every match)
        if not ("calls=" in a or "to_apply=" in a or "body=" in a or "condition=" in a or "_computation=" in a
                or "computations=" in a):
            return ()
        out = [(m.group(1), m.group(2)) for m in _CALLED.finditer(a)]
        if "computations=" in a:
            for m in _CALLED_LIST.finditer(a):
                out += [(m.group(1), c.strip().lstrip("%")) for c in m.group(2).split(",") if c.strip()]
        return tuple(out)

    @property
    def backend_config(self) -> dict:
        i = self.attrs.find("backend_config=")
        if i < 0:
            return {}
        try:
            obj, _ = json.JSONDecoder().raw_decode(self.attrs, i + len("backend_config="))
        except ValueError:
            return {}
        return obj if isinstance(obj, dict) else {}

    def attr(self, key: str) -> str | None:
        """The raw text of attribute `key` (balanced braces/brackets kept), or None."""
        m = re.search(rf"(?:^|[ ,]){re.escape(key)}=", self.attrs)
        if not m:
            return None
        i = j = m.end()
        depth = 0
        while j < len(self.attrs):
            ch = self.attrs[j]
            if ch in "{[(":
                depth += 1
            elif ch in "}])":
                depth -= 1
            elif ch == "," and depth == 0:
                break
            j += 1
        return self.attrs[i:j].strip()


@dataclasses.dataclass(frozen=True)
class Computation:
    name: str
    is_entry: bool
    lines: tuple[str, ...]                  # the computation's text, header to closing brace
    instructions: tuple[Instruction, ...]


@dataclasses.dataclass(frozen=True)
class Module:
    name: str
    computations: dict[str, Computation]
    entry: str
    text: str = dataclasses.field(default="", repr=False, compare=False)  # what it was parsed from

    def instructions(self):
        for comp in self.computations.values():
            yield from comp.instructions

    @cached_property
    def by_name(self) -> dict[str, Instruction]:
        """Instruction name -> instruction (names are unique in a module)."""
        return {ins.name: ins for ins in self.instructions()}

    @cached_property
    def trip_counts(self) -> dict[str, int | None]:
        """While instruction name -> its known trip count (None when XLA proved none)."""
        out = {}
        for ins in self.instructions():
            if ins.opcode == "while":
                n = ins.backend_config.get("known_trip_count", {}).get("n")
                out[ins.name] = int(n) if n is not None else None
        return out

    @cached_property
    def multiplicity(self) -> dict[str, int]:
        """Computation -> times it runs per execution of the entry computation.

        A while body counts its loop's trip count (1 when unknown: see `unknown_trip_counts`),
        its condition one more; every other call once per call.
        """
        calls: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for comp in self.computations.values():
            for ins in comp.instructions:
                trip = self.trip_counts.get(ins.name) if ins.opcode == "while" else None
                for attr, callee in ins.called:
                    if callee not in self.computations:
                        continue
                    if attr == "body":
                        n = trip or 1
                    elif attr == "condition" and ins.opcode == "while":
                        n = (trip or 1) + 1
                    else:
                        n = 1
                    calls[comp.name].append((callee, n))
        order: list[str] = []
        seen: set[str] = set()

        def visit(name: str) -> None:  # post-order: callees first
            if name in seen:
                return
            seen.add(name)
            for callee, _ in calls.get(name, ()):
                visit(callee)
            order.append(name)

        visit(self.entry)
        mult: dict[str, int] = defaultdict(int)
        mult[self.entry] = 1
        for name in reversed(order):  # callers before callees: a DAG in topological order
            for callee, n in calls.get(name, ()):
                mult[callee] += mult[name] * n
        return dict(mult)

    @property
    def unknown_trip_counts(self) -> list[str]:
        return [name for name, n in self.trip_counts.items() if n is None]

    def reachable(self, root: str) -> list[str]:
        """Computations reachable from `root` (itself included), callees before callers."""
        order: list[str] = []
        seen: set[str] = set()

        def visit(name: str) -> None:
            if name in seen or name not in self.computations:
                return
            seen.add(name)
            for ins in self.computations[name].instructions:
                for _, callee in ins.called:
                    visit(callee)
            order.append(name)

        visit(root)
        return order

    def submodule_text(self, root: str) -> str:
        """HLO text of a module whose entry is `root` (with everything it calls), for XLA's parser.
        For the entry itself that is the module's own text (XLA reads only what the entry reaches)."""
        if root == self.entry and self.text:
            return self.text
        parts = [f"HloModule {self.name}_{root}\n"]
        for name in self.reachable(root):
            lines = list(self.computations[name].lines)
            header = re.sub(r"^ENTRY\s+", "", lines[0])
            lines[0] = f"ENTRY {header}" if name == root else header
            # stack frame ids index a table printed with the whole module only
            parts.append(_STACK_FRAME.sub("", "\n".join(lines)) + "\n")
        return "\n".join(parts)


def parse_module(text: str) -> Module:
    """Split optimized HLO text into computations and instructions."""
    lines = text.splitlines()
    name = "module"
    if lines and lines[0].startswith("HloModule "):
        name = re.split(r"[\s,]", lines[0][len("HloModule "):], maxsplit=1)[0]
    comps: dict[str, Computation] = {}
    entry = None
    i = 0
    while i < len(lines):
        m = _HEADER.match(lines[i])
        if not m:
            i += 1
            continue
        start, comp_name, is_entry = i, m.group(2), bool(m.group(1))
        i += 1
        instrs = []
        while i < len(lines) and lines[i].rstrip() != "}":
            ins = _parse_instruction(lines[i], comp_name)
            if ins is not None:
                instrs.append(ins)
            i += 1
        comps[comp_name] = Computation(comp_name, is_entry, tuple(lines[start:i + 1]), tuple(instrs))
        if is_entry:
            entry = comp_name
        i += 1
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return Module(name, comps, entry, text)


def _parse_instruction(line: str, computation: str) -> Instruction | None:
    m = _INSTR.match(line)
    if not m:
        return None
    rest = line[m.end():]
    # The shape: a balanced tuple "( ... )" or one array token.
    if rest.startswith("("):
        j = _closing(rest, 0)
        shape_text, rest = rest[:j + 1], rest[j + 1:].lstrip()
    else:
        shape_text, _, rest = rest.partition(" ")
    op = _OPCODE.match(rest)
    if not op:
        return None
    j = _closing(rest, op.end() - 1)
    return Instruction(m.group(2), shape_text, op.group(1), rest[op.end():j], rest[j + 1:].lstrip(", "), computation)


def _closing(s: str, i: int) -> int:
    """Index of the ")" that closes the "(" at s[i] (the last index if none does). Jumps from
    parenthesis to parenthesis: instructions are long, their parentheses few."""
    depth, j = 0, i
    while True:
        close = s.find(")", j)
        if close < 0:
            return len(s) - 1
        opening = s.find("(", j, close)
        if opening >= 0:
            depth, j = depth + 1, opening + 1
        else:
            depth, j = depth - 1, close + 1
            if depth == 0:
                return close
