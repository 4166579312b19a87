"""Which module made a buffer XLA left without a name: followed through the program's graph.

XLA makes buffers the model's code never named: the zero-filled stacks a scan's loop writes each
layer's residuals into (a ``broadcast`` fusion, empty ``op_name``), the copies and transposes of those
stacks its layout passes add, the tuples a loop carries. A scan also names its own scaffolding for the
loop's scope only (``layers/while/body/dynamic_update_slice`` is ``Decoder``, not the attention that
made the slice). This module reads the optimized module's graph from the ``xla.HloProto`` (operands,
users, called computations, tuple indices) and gives such a buffer the module of the value it holds:

- a ``dynamic-update-slice`` (in place, a stacked residual or gradient written layer by layer): the
  module that produced the slice written (its update operand);
- a copy, transpose, bitcast, reshape, convert, broadcast, slice or collective: its data's (operand 0);
- a fusion: its fused root's, whose parameters are the fusion's operands;
- a ``get-tuple-element`` of a loop, a fusion or a tuple: that element's (a loop's element is what its
  body writes there, the loop's input where the body passes it on);
- a value with no named source (a broadcast constant): what its users make of it -- the loop element it
  is carried as, the stack a dynamic-update-slice writes into it.

A path found this way replaces the buffer's own only where it says more: empty, or a scope the found
path lies under (``Decoder`` -> ``Decoder/layers/attn``); a value the model's code named stays named.

A collective's data is followed back the same way to the step's argument it is (``Graph.argument``):
an all-gathered parameter is that parameter moved, cast, sliced out of a scan's stack (a loop state its
body passes on unchanged), or gathered; an all-gathered activation or batch is computed, or another
argument -- what the gathered_params_live audit (jaxmem/xla/explain.py) tells apart.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from jaxmem.xla import opnames, wire

_MODULE_COMPUTATIONS = frozenset({3})
_COMPUTATION = frozenset({2, 5, 6})                           # instructions, id, root_id
# name, opcode, metadata, parameter_number, tuple_index, id, operand_ids, called_computation_ids
_INSTRUCTION = frozenset({1, 2, 7, 9, 13, 35, 36, 38})
_METADATA = frozenset({2})


def instruction_op_name(buf: bytes, ins: dict) -> str:
    """An HloInstructionProto's op_name metadata (field 7's last occurrence), "" without one."""
    meta = ins.get(7)
    if not meta:
        return ""
    ms, me = meta[-1]
    return wire.string(buf, wire.fields(buf, ms, me, _METADATA).get(2))


# Opcodes whose result is their first operand's data, moved or reshaped: the data's module is theirs.
MOVES = frozenset({
    "copy", "copy-start", "copy-done", "transpose", "bitcast", "reshape", "convert", "bitcast-convert", "broadcast",
    "slice", "dynamic-slice", "pad", "reverse", "concatenate", "optimization-barrier",
    "all-gather", "all-gather-start", "all-gather-done", "all-reduce", "all-reduce-start", "all-reduce-done",
    "reduce-scatter", "all-to-all", "collective-permute", "collective-permute-start", "collective-permute-done",
    "async-start", "async-update", "async-done",
})
_WITH_INDICES = frozenset({"dynamic-slice", "pad", "concatenate"})   # several operands, the data first
_USER_DEPTH = 6   # how far users are followed from a value with no named source


@dataclasses.dataclass(frozen=True)
class Node:
    opcode: str
    path: str                      # the module path of its own op_name ("" without one)
    operands: tuple[int, ...]
    called: tuple[int, ...]
    computation: int
    parameter_number: int
    tuple_index: int


@dataclasses.dataclass
class Graph:
    nodes: dict[int, Node]
    roots: dict[int, int]                                  # computation id -> root instruction id
    callers: dict[int, list[int]]                          # computation id -> instructions calling it
    users: dict[int, list[int]]                            # instruction -> its users (program order)
    entry: int = -1                                        # the entry computation's id
    _memo: dict[tuple[int, tuple[int, ...]], str] = dataclasses.field(default_factory=dict)

    def path(self, iid: int, index: tuple[int, ...] = ()) -> str:
        """The module of the value `index` of instruction `iid`: its own path, or a more specific one its
        sources give; from its users where neither names one."""
        found = self._resolve(iid, index)
        node = self.nodes.get(iid)
        if "/" in found and node is not None and node.operands:
            return found
        # nothing, the model's root scope alone, or a value made of no input (a scan's zero-filled stack, a
        # gradient accumulator's zeros): the module its users make of it
        used = self._from_users(iid, index, _USER_DEPTH)
        return used if used and (not found or used.startswith(found + "/")) else found

    def _resolve(self, iid: int, index: tuple[int, ...]) -> str:
        key = (iid, index)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = ""           # in progress: a loop's cycle back here finds nothing
        node = self.nodes.get(iid)
        out = ""
        if node is not None:
            deep = self._source(node, index)
            own = node.path
            out = deep if deep and (not own or deep.startswith(own + "/")) else own or deep
        self._memo[key] = out
        return out

    def _source(self, n: Node, index: tuple[int, ...]) -> str:
        op = n.opcode
        if op == "get-tuple-element" and n.operands:
            return self._resolve(n.operands[0], (n.tuple_index, *index))
        if op == "tuple":
            return self._resolve(n.operands[index[0]], index[1:]) if index and index[0] < len(n.operands) else ""
        if op == "while" and n.called:
            body = self._body(n)
            got = self._resolve(self.roots[body], index) if body in self.roots else ""
            return got or (self._resolve(n.operands[0], index) if n.operands else "")
        if op == "fusion" and n.called and n.called[0] in self.roots:
            return self._resolve(self.roots[n.called[0]], index)
        if op == "parameter":
            for caller in self.callers.get(n.computation, ()):
                c = self.nodes[caller]
                if c.opcode == "fusion" and n.parameter_number < len(c.operands):
                    return self._resolve(c.operands[n.parameter_number], index)
                if c.opcode == "while":   # the loop's state: what the body writes into it, else its input
                    return self._resolve(caller, index) or self._resolve(c.operands[0], index)
            return ""
        if op == "dynamic-update-slice" and len(n.operands) > 1:
            return self._resolve(n.operands[1], ()) or self._resolve(n.operands[0], ())
        if op in MOVES and n.operands:
            return self._resolve(n.operands[0], index)
        if not n.path:   # an unnamed computation: its first named input's
            for o in n.operands:
                got = self._resolve(o, ())
                if got:
                    return got
        return ""

    def argument(self, iid: int, index: tuple[int, ...] = ()) -> tuple[int, bool]:
        """(the flat argument index of the entry parameter that the value `index` of instruction `iid` holds
        -- moved, cast, sliced, gathered, carried unchanged through a loop -- or -1 where it is computed
        (from an argument or not); whether it is a scanned layer's: one iteration's dynamic slice of a stack
        a loop carries). A collective's own buffer: what it gathers or reduces."""
        seen: set[tuple[int, tuple[int, ...]]] = set()
        sliced = scanned = False
        while (iid, index) not in seen:
            seen.add((iid, index))
            n = self.nodes.get(iid)
            if n is None:
                return -1, scanned
            step = self._argument_step(n, index)
            if isinstance(step, int):
                return step, scanned
            sliced = sliced or n.opcode == "dynamic-slice"
            scanned = scanned or (sliced and n.opcode == "parameter" and any(
                self.nodes[c].opcode == "while" for c in self.callers.get(n.computation, ())))
            iid, index = step
        return -1, scanned

    def _argument_step(self, n: Node, index: tuple[int, ...]) -> int | tuple[int, tuple[int, ...]]:
        """One step of `argument`: the answer (an int), or the (instruction, index) that holds the same data."""
        op = n.opcode
        if op == "parameter":
            if n.computation == self.entry:   # a tupled entry parameter's element: the flat argument index
                return index[0] if index else n.parameter_number
            return self._into_parameter(n, index)
        if op == "get-tuple-element" and n.operands:
            return n.operands[0], (n.tuple_index, *index)
        if op == "tuple":
            return (n.operands[index[0]], index[1:]) if index and index[0] < len(n.operands) else -1
        if op == "fusion" and n.called and n.called[0] in self.roots:
            return self.roots[n.called[0]], index
        if op == "while" and n.called:
            body = self._body(n)
            return (self.roots[body], index) if body in self.roots else -1
        if not n.operands or not (op in opnames.COLLECTIVES or op in opnames.ASYNC or op in MOVES):
            return -1
        if op.endswith("-done") or op == "async-update":   # the value its -start holds, element for element
            return n.operands[0], index
        # a combined collective's element i is its operand i's (a -start's output: (operands, results, ...))
        if len(n.operands) > 1 and index and op not in _WITH_INDICES:
            return (n.operands[index[-1]], ()) if index[-1] < len(n.operands) else -1
        return n.operands[0], (index if op in ("copy", "optimization-barrier") else ())

    def _into_parameter(self, n: Node, index: tuple[int, ...]) -> int | tuple[int, tuple[int, ...]]:
        """A called computation's parameter: the caller's operand (a fusion's, an async wrapper's), or a loop
        state element its body passes on unchanged (a scan's stacked weights), the loop's input there."""
        for caller in self.callers.get(n.computation, ()):
            c = self.nodes[caller]
            if c.opcode == "while" and index and c.operands and n.computation == self._body(c):
                root = self.nodes.get(self.roots.get(n.computation, -1))
                passed = root is not None and root.opcode == "tuple" and index[0] < len(root.operands) and \
                    self._is_element(root.operands[index[0]], n, index[0])
                return (c.operands[0], index) if passed else -1
            if c.opcode != "while" and n.parameter_number < len(c.operands):
                return c.operands[n.parameter_number], index
        return -1

    def _is_element(self, iid: int, param: Node, i: int) -> bool:
        """Instruction `iid` is element `i` of the loop body's parameter `param` (got, perhaps copied)."""
        node = self.nodes.get(iid)
        while node is not None and node.opcode in ("copy", "bitcast", "optimization-barrier") and node.operands:
            node = self.nodes.get(node.operands[0])
        if node is None or node.opcode != "get-tuple-element" or node.tuple_index != i or not node.operands:
            return False
        return self.nodes.get(node.operands[0]) is param

    def _body(self, n: Node) -> int:
        """A while loop's body: of its two computations, the one returning the loop's tuple (the
        condition returns a predicate)."""
        for c in n.called:
            root = self.nodes.get(self.roots.get(c, -1))
            if root is not None and root.opcode == "tuple":
                return c
        return n.called[0]

    def _from_users(self, iid: int, index: tuple[int, ...], depth: int) -> str:
        if depth <= 0:
            return ""
        for u in self.users.get(iid, ()):
            n = self.nodes[u]
            if n.opcode == "get-tuple-element":
                if index and n.tuple_index == index[0]:
                    got = self._resolve(u, index[1:]) or self._from_users(u, index[1:], depth - 1)
                    if got:
                        return got
                continue
            if n.opcode == "tuple":   # carried as a loop's element: what the loop writes there
                position = n.operands.index(iid)
                got = self._from_users(u, (position, *index), depth - 1)
            elif n.opcode == "while":
                got = self._resolve(u, index)
            elif n.opcode == "dynamic-update-slice" and n.operands and n.operands[0] == iid:
                got = self._resolve(u, ())
            elif index:
                continue
            else:
                got = self._resolve(u, ())
            if got:
                return got
        return ""


def read_graph(buf: bytes, module: dict) -> Graph:
    """Every instruction of the optimized module (an ``xla.HloModuleProto`` read by jaxmem.xla.hlo)."""
    nodes: dict[int, Node] = {}
    roots: dict[int, int] = {}
    callers: dict[int, list[int]] = defaultdict(list)
    users: dict[int, list[int]] = defaultdict(list)
    paths: dict[str, str] = {}
    for s, e in module.get(3, ()):
        comp = wire.fields(buf, s, e, _COMPUTATION)
        cid = wire.integer(comp.get(5))
        roots[cid] = wire.integer(comp.get(6))
        for a, b in comp.get(2, ()):
            ins = wire.fields(buf, a, b, _INSTRUCTION)
            op_name = instruction_op_name(buf, ins)
            iid = wire.integer(ins.get(35))
            opcode = wire.string(buf, ins.get(2))
            path = paths[op_name] if op_name in paths else paths.setdefault(op_name, opnames.module_path(op_name))
            operands = tuple(wire.packed(buf, ins.get(36)))
            called = tuple(wire.packed(buf, ins.get(38)))
            node = Node(opcode, path, operands, called, cid, wire.integer(ins.get(9)), wire.integer(ins.get(13)))
            nodes[iid] = node
            for c in called:
                callers[c].append(iid)
            for o in operands:
                users[o].append(iid)
    return Graph(nodes, roots, dict(callers), dict(users), wire.integer(module.get(6), -1))


def refine(paths: Sequence[str], where: Sequence[tuple[int, tuple[int, ...]]], graph: Graph,
           skip: Sequence[bool]) -> list[str]:
    """Each buffer's module path (`paths`, from its own op_name), made more specific or found through the
    graph where that says more; `where`: each buffer's (instruction id, shape index); `skip`: buffers
    left as they are (entry parameters and constants: their leaf names them)."""
    out = []
    for own, (iid, index), keep in zip(paths, where, skip, strict=True):
        if keep or iid < 0:
            out.append(own)
            continue
        found = graph.path(iid, tuple(index))
        out.append(found if found and (not own or found.startswith(own + "/")) else own)
    return out
