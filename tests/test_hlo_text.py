"""Reading XLA's printed HLO: instructions split into name, shape, opcode, operands and
attributes whatever parentheses they hold, and the computations each one calls."""
from jaxmem.xla import hlo_text

MODULE = """HloModule m, is_scheduled=true

%body (p: (s32[], (f32[2]{0}, u8[]))) -> (s32[], (f32[2]{0}, u8[])) {
  %p = (s32[], (f32[2]{0}, u8[])) parameter(0)
  ROOT %t = (s32[], (f32[2]{0}, u8[])) tuple(s32[] %i, (f32[2]{0}, u8[]) %inner), metadata={op_name="a(b)"}
}

%cond (p.1: (s32[], (f32[2]{0}, u8[]))) -> pred[] {
  %p.1 = (s32[], (f32[2]{0}, u8[])) parameter(0)
  ROOT %lt = pred[] compare(s32[] %x, s32[] %y), direction=LT
}

ENTRY %main (a: f32[2]) -> f32[2] {
  %a = f32[2]{0} parameter(0)
  %w = (s32[], (f32[2]{0}, u8[])) while((s32[], (f32[2]{0}, u8[])) %init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %f = f32[2]{0} fusion(f32[2]{0} %a), kind=kLoop, calls=%fused
  %c = f32[2]{0} conditional(pred[] %q, f32[2]{0} %a, f32[2]{0} %a), branch_computations={%b0, %b1}
  ROOT %add = f32[2]{0} add(f32[2]{0} %f, f32[2]{0} %a)
}
"""


def test_instructions_split_whatever_parentheses_their_shapes_operands_and_attributes_hold():
    m = hlo_text.parse_module(MODULE)
    assert m.entry == "main" and set(m.computations) == {"body", "cond", "main"}
    t = m.by_name["t"]
    assert t.shape_text == "(s32[], (f32[2]{0}, u8[]))" and t.opcode == "tuple"
    assert t.operands == "s32[] %i, (f32[2]{0}, u8[]) %inner"
    assert t.attrs == 'metadata={op_name="a(b)"}'
    w = m.by_name["w"]
    assert w.opcode == "while" and w.operands == "(s32[], (f32[2]{0}, u8[])) %init"
    assert w.attrs.startswith("condition=%cond, body=%body")
    assert m.by_name["add"].operands == "f32[2]{0} %f, f32[2]{0} %a" and m.by_name["add"].attrs == ""


def test_an_instruction_cut_short_keeps_what_it_has():
    ins = hlo_text._parse_instruction("  %u = f32[] negate(f32[] %x", "c")
    assert ins is not None and ins.opcode == "negate" and ins.operands == "f32[] %"  # up to the last character
    assert hlo_text._parse_instruction("  %v = (f32[] x", "c") is None        # no opcode after the shape
    assert hlo_text._parse_instruction("}", "c") is None


def test_called_computations_are_found_and_plain_instructions_call_none():
    m = hlo_text.parse_module(MODULE)
    assert m.by_name["w"].called == (("condition", "cond"), ("body", "body"))
    assert m.by_name["f"].called == (("calls", "fused"),)
    assert m.by_name["c"].called == (("branch_computations", "b0"), ("branch_computations", "b1"))
    assert m.by_name["add"].called == () and m.by_name["lt"].called == ()
    assert m.trip_counts == {"w": 4}
    assert m.multiplicity["body"] == 4 and m.multiplicity["cond"] == 5
