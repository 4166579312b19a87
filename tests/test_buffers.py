"""jaxmem.xla (wire, hlo, opnames, timeline, categories, dump): the wire-format reader, XLA's memory curve, attribution and categories.

The compiled tests build four small training programs (an MLP step, a scanned transformer
step with a dominant logits buffer, a donated step, an FSDP-like sharded step with
all-gathers) and compile each for the CPU backend and, devicelessly, for an 8 x H100 target.
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmem.compiler import versions
from jaxmem.xla import categories, dump, hlo, opnames, wire
from jaxmem.xla.buffers import Buffer, BufferAssignment, slice_paths

# GpuTargetConfigProto of an H100 SXM 80GB (docs/how-it-works.md §3), in text format.
H100 = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 84942979072
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 12 minor: 8 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


# ---------------------------------------------------------------------------------------------
# A tiny protobuf encoder, for hand-made messages.
# ---------------------------------------------------------------------------------------------

def _varint(v: int) -> bytes:
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, value) -> bytes:
    """int -> varint field; bytes / str -> length-delimited field."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    if isinstance(value, str):
        value = value.encode()
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _msg(*fields: tuple[int, object]) -> bytes:
    return b"".join(_field(n, v) for n, v in fields)


def _packed(number: int, values: list[int]) -> bytes:
    return _field(number, b"".join(_varint(v) for v in values))


# ---------------------------------------------------------------------------------------------
# Wire format.
# ---------------------------------------------------------------------------------------------

def test_fields_reads_every_wire_type_and_skips_unwanted():
    data = (_msg((1, 5), (2, "abc"), (3, 300)) + _varint(4 << 3 | 1) + (7).to_bytes(8, "little")
            + _varint(5 << 3 | 5) + (9).to_bytes(4, "little") + _msg((6, 2**40)))
    f = wire.fields(data, 0, len(data), frozenset({1, 2, 4, 5, 6}))
    assert f[1] == [5]
    s, e = f[2][0]
    assert data[s:e] == b"abc"
    assert 3 not in f
    assert f[4] == [7] and f[5] == [9] and f[6] == [2**40]


def test_packed_unpacked_and_negative_int64():
    data = _packed(3, [1, 300, -1]) + _msg((3, 7), (3, -5))
    f = wire.fields(data, 0, len(data), frozenset({3}))
    assert wire.packed(data, f[3]) == [1, 300, -1, 7, -5]


def test_truncated_and_unknown_wire_types_are_errors():
    data = _msg((2, "abcdef"))
    with pytest.raises((ValueError, IndexError)):
        wire.fields(data[:-2], 0, len(data) - 2, frozenset({2}))
    with pytest.raises(ValueError, match="wire type"):
        wire.fields(_varint(1 << 3 | 3), 0, 1, frozenset())


# ---------------------------------------------------------------------------------------------
# Names.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op_name,path", [
    ("jit(step)/transpose(jvp(Llama))/layers/attn/dot_general", "Llama/layers/attn"),
    ("jit(step)/jvp(logits)/dot_general", "logits"),
    ("jit(step)/transpose(jvp(layers))/while/body/closed_call/checkpoint/rematted_computation/mlp/dot_general",
     "layers/mlp"),
    ("jit(step)/jvp(layers)/while/body/closed_call/attn/bthd,bshd->bhts/dot_general", "layers/attn"),
    ("jit(step)/transpose(jvp(jit(take_along_axis)))/scatter-add", ""),
    ("jit(step)/attn/jit(_where)/broadcast_in_dim", "attn"),
    ("jit(step)/vmap(jvp(Block_0))/mlp/add", "Block_0/mlp"),
    ("jit(step)/jvp()/mul", ""),
    ("jit(step)/add", ""),
    ("broadcast.66", ""),
    ("params['layers']['w1']", ""),
    ("jit(loss)/transpose(jvp())/mul;jit(loss)/transpose(jvp())/broadcast_in_dim", ""),
    ("jit(f)/jvp(Net)/head/add;jit(f)/jvp()/mul", "Net/head"),
    ("jit(f)/jvp(Net)/a/x/add;jit(f)/jvp(Net)/a/y/add", "Net/a"),
    ("", ""),
])
def test_module_path(op_name, path):
    assert opnames.module_path(op_name) == path


# ---------------------------------------------------------------------------------------------
# The memory curve on a hand-made assignment: static memory, SHARE_WITH, chained traces.
# ---------------------------------------------------------------------------------------------

def _logical(bid, size, iid=0):
    return _msg((1, bid), (2, size), (3, _msg((4, iid))))


def _allocation(index, size, assigned, *, param=None, live_out=False, thread_local=False):
    fields = [(1, index), (2, size)]
    if thread_local:
        fields.append((3, 1))
    if param is not None:
        fields += [(5, 1), (6, param)]
    if live_out:
        fields.append((7, 1))
    fields += [(9, _msg((1, bid), (2, off), (3, sz))) for bid, off, sz in assigned]
    return _msg(*fields)


def _event(kind, bid, canonical=None):
    fields = [(1, kind), (2, bid), (3, "main"), (4, f"i{bid}")]
    if canonical is not None:
        fields.append((5, canonical))
    return _msg(*fields)


ALLOC, FREE, SHARE = 0, 1, 2


def _synthetic() -> bytes:
    logical = [_logical(0, 100), _logical(1, 50), _logical(2, 30), _logical(3, 20), _logical(4, 60), _logical(5, 4)]
    allocations = [
        _allocation(0, 100, [(0, 0, 100)], param=0),
        _allocation(1, 70, [(1, 0, 50), (2, 0, 30), (3, 50, 20)]),
        _allocation(2, 60, [(4, 0, 60)], live_out=True),
        _allocation(3, 4, [(5, 0, 4)], thread_local=True),
    ]
    trace1 = _msg(*[(1, e) for e in [
        _event(ALLOC, 1),             # 100 + 60 static -> 210
        _event(SHARE, 2, 1),          # 2 rides on 1: 210
        _event(FREE, 1),              # 1's bytes stay while 2 lives: 210
        _event(ALLOC, 3),             # 230  <- peak
        _event(FREE, 2),              # 180
        _event(FREE, 3),              # 160
    ]], (2, 1), (3, 1))
    trace2 = _msg((1, _event(ALLOC, 3)), (1, _event(FREE, 3)), (3, 1))   # chained: 180, 160
    return b"".join([*(_field(1, m) for m in logical), *(_field(3, m) for m in allocations),
                     _field(4, trace1), _field(4, trace2)])


def test_synthetic_curve_follows_xla_compute_peak_memory():
    a = hlo.decode_buffer_assignment(_synthetic())
    assert a.timeline.tolist() == [160, 210, 210, 210, 230, 180, 160, 180, 160]
    assert (a.peak_bytes, a.peak_index) == (230, 4)
    assert a.traces == (1, 7)
    by_id = {b.id: b for b in a.buffers}
    assert by_id[0].is_parameter and by_id[0].parameter_number == 0 and (by_id[0].start, by_id[0].end) == (0, 8)
    assert by_id[4].live_out and (by_id[4].start, by_id[4].end) == (0, 8)
    assert (by_id[1].start, by_id[1].end) == (1, 2)
    assert (by_id[2].start, by_id[2].end) == (2, 4)
    assert (by_id[3].start, by_id[3].end) == (4, 7)       # first ALLOC .. last FREE, over both traces
    assert by_id[5].is_thread_local and (by_id[5].start, by_id[5].end) == (-1, -1)
    # Whose bytes: buffer 1 holds its 50 bytes until its sharer 2 is freed.
    assert [b.id for b in a.live_at(4)] == [0, 4, 1, 3]
    assert {b.id for b in a.live_at(4, include_shared=True)} == {0, 1, 2, 3, 4}
    for i, total in enumerate(a.timeline):
        assert sum(b.size for b in a.live_at(i)) == total


def test_static_memory_counts_the_largest_buffer_of_each_allocation():
    logical = [_logical(0, 40), _logical(1, 64), _logical(2, 64)]
    allocations = [_allocation(0, 64, [(0, 0, 40), (1, 0, 64), (2, 0, 64)], live_out=True)]
    data = b"".join([*(_field(1, m) for m in logical), *(_field(3, m) for m in allocations)])
    a = hlo.decode_buffer_assignment(data)
    assert a.timeline.tolist() == [64] and a.peak_bytes == 64
    assert [b.id for b in a.live_at(0)] == [1]                 # the first of the largest


def _buffer(**kw) -> Buffer:
    base = dict(id=0, size=8, instruction="x", shape_index=(), shape=(2,), dtype="f32", opcode="fusion",
                op_name="", module_path="", allocation=0, offset=0, is_parameter=False, parameter_number=None,
                parameter_shape_index=(), live_out=False, is_constant=False, start=1, end=2, is_backward=False)
    base.update(kw)
    return Buffer(**base)


def test_categorize_rules():
    cats = ["params", "optimizer_state", "batch"]
    assert categories.categorize(_buffer(is_parameter=True, parameter_number=1), cats) == "optimizer_state"
    # All arguments as one tuple parameter: the element index picks the category.
    assert categories.categorize(_buffer(is_parameter=True, parameter_number=0, parameter_shape_index=(2,)),
                              cats) == "batch"
    assert categories.categorize(_buffer(is_parameter=True, parameter_number=0, dtype="tuple"), cats) == "other_state"
    assert categories.categorize(_buffer(is_parameter=True, parameter_number=7), cats) == "other_state"
    assert categories.categorize(_buffer(live_out=True), cats) == "outputs"
    assert categories.categorize(_buffer(opcode="all-gather-start", collective=True), cats) == "collectives"
    a = BufferAssignment(buffers=(), timeline=np.zeros(10, np.int64), peak_bytes=0, peak_index=0,
                         backward_start=5, backward_end=8, param_shapes={(2,): (0,), (3,): (1,)})
    grad = _buffer(op_name="jit(s)/transpose(jvp(m))/mul", is_backward=True, start=6, end=9)
    assert categories.categorize(grad, cats, assignment=a) == "gradients"
    saved = _buffer(op_name="jit(s)/jvp(m)/mul", shape=(3,), start=2, end=7)
    assert categories.categorize(saved, cats, assignment=a) == "activations"
    not_a_grad = _buffer(op_name="jit(s)/transpose(jvp(m))/mul", is_backward=True, shape=(3,), start=6, end=9)
    assert categories.categorize(not_a_grad, cats, assignment=a) == "temporaries"    # shaped like optimizer state
    assert categories.categorize(saved, cats) == "temporaries"
    local = _buffer(op_name="jit(s)/jvp(m)/mul", start=2, end=3)
    assert categories.categorize(local, cats, assignment=a) == "temporaries"


def test_hlo_proto_joins_names_shapes_and_op_names():
    shape = _msg((2, 11)) + _packed(3, [4, 8])                                     # f32[4,8]
    tup = _msg((2, 13), (4, _msg((2, 16)) + _packed(3, [2])), (4, shape))          # (bf16[2], f32[4,8])
    meta = _msg((1, "dot_general"), (2, "jit(step)/jvp(net)/dense/dot_general"))
    iid = (3 << 32) | 7
    ins = _msg((1, "fusion.1"), (2, "fusion"), (3, tup), (7, meta), (35, iid))
    pid = (3 << 32) | 1
    par = _msg((1, "p0"), (2, "parameter"), (3, shape), (7, _msg((2, "params['w']"))), (35, pid))
    comp = _msg((1, "main"), (2, par), (2, ins), (5, 3), (6, iid))
    fused = _msg((1, "fused"), (2, _msg((1, "x"), (2, "add"), (35, (9 << 32) | 1))), (5, 9))
    module = _msg((1, "jit_step"), (3, fused), (3, comp), (6, 3))
    logical = [_msg((1, 0), (2, 128), (3, _msg((4, pid)))),
               _msg((1, 1), (2, 128), (3, _packed(3, [1]) + _msg((4, iid))))]
    allocations = [_allocation(0, 128, [(0, 0, 128)], param=0), _allocation(1, 128, [(1, 0, 128)])]
    trace = _msg((1, _event(ALLOC, 1)), (1, _event(FREE, 1)))
    assignment = b"".join([*(_field(1, m) for m in logical), *(_field(3, m) for m in allocations), _field(4, trace)])
    a = hlo.decode_hlo_proto(_msg((1, module), (3, assignment)))
    assert a.module_name == "jit_step"
    p, f = sorted(a.buffers, key=lambda b: b.id)
    assert (p.instruction, p.opcode, p.shape, p.dtype, p.op_name) == ("p0", "parameter", (4, 8), "f32", "params['w']")
    assert (f.instruction, f.shape_index, f.shape, f.dtype, f.module_path) == ("fusion.1", (1,), (4, 8), "f32",
                                                                               "net/dense")
    assert f.computation == "main" and not f.is_backward
    assert a.timeline.tolist() == [128, 256, 128]


def test_async_ops_wrapping_a_collective_are_collectives():
    f32 = _msg((2, 11)) + _packed(3, [64])
    rs = _msg((1, "reduce-scatter.1"), (2, "reduce-scatter"), (3, f32), (35, (5 << 32) | 2))
    wrapped = _msg((1, "async_computation"), (2, rs), (5, 5), (6, (5 << 32) | 2))
    start_id, done_id = (1 << 32) | 1, (1 << 32) | 2
    start = _msg((1, "rs-start"), (2, "async-start"), (3, f32), (35, start_id), (38, _varint(5)))
    done = _msg((1, "rs-done"), (2, "async-done"), (3, f32), (35, done_id), (36, _varint(start_id)))
    module = _msg((1, "m"), (3, wrapped), (3, _msg((1, "main"), (2, start), (2, done), (5, 1), (6, done_id))))
    logical = [_msg((1, 0), (2, 256), (3, _msg((4, start_id)))), _msg((1, 1), (2, 256), (3, _msg((4, done_id))))]
    allocations = [_allocation(0, 512, [(0, 0, 256), (1, 256, 256)])]
    assignment = b"".join([*(_field(1, m) for m in logical), *(_field(3, m) for m in allocations)])
    a = hlo.decode_hlo_proto(_msg((1, module), (3, assignment)))
    assert [(b.opcode, b.collective) for b in a.buffers] == [("async-start", True), ("async-done", True)]
    assert categories.categorize(a.buffers[1], []) == "collectives"


# ---------------------------------------------------------------------------------------------
# Real compiles: four programs, two backends.
# ---------------------------------------------------------------------------------------------

def _sds(shape, mesh, spec=(), dtype=jnp.float32):
    if mesh is None:
        return jax.ShapeDtypeStruct(shape, dtype)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*spec)))


def _mlp(mesh, donate=False):
    sizes = [512, 1024, 1024, 10]
    params = [(_sds((a, b), mesh), _sds((b,), mesh)) for a, b in zip(sizes[:-1], sizes[1:])]
    x, y = _sds((256, 512), mesh), _sds((256,), mesh, dtype=jnp.int32)

    def loss(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            with jax.named_scope(f"dense{i}"):
                h = h @ w + b
                if i < len(params) - 1:
                    h = jax.nn.relu(h)
        return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()

    def step(params, x, y):
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params, x, y))

    return step, (params, x, y), ((0,) if donate else ()), ["params"] * 6 + ["batch"] * 2


def _transformer(mesh, L=4, d=256, T=128, B=8, V=32768, f=1024):
    """A scanned, rematted transformer-like step whose (B*T, V) logits dominate the peak."""
    params = {"embed": _sds((V, d), mesh), "head": _sds((d, V), mesh),
              "layers": {"wqkv": _sds((L, d, 3 * d), mesh), "wo": _sds((L, d, d), mesh),
                         "w1": _sds((L, d, f), mesh), "w2": _sds((L, f, d), mesh)}}
    tokens = _sds((B, T), mesh, dtype=jnp.int32)

    def layer(x, p):
        with jax.named_scope("attn"):
            q, k, v = jnp.split(x @ p["wqkv"], 3, -1)
            x = x + (jax.nn.softmax(q @ k.transpose(0, 2, 1) / 16.0, -1) @ v) @ p["wo"]
        with jax.named_scope("mlp"):
            x = x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]
        return x, None

    def loss(params, tokens):
        x = params["embed"][tokens]
        with jax.named_scope("layers"):
            x, _ = jax.lax.scan(jax.checkpoint(layer), x, params["layers"])
        with jax.named_scope("logits"):
            logits = x @ params["head"]
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

    tx = optax.adam(1e-3)
    opt = jax.eval_shape(tx.init, params)
    opt = jax.tree.map(lambda o: _sds(o.shape, mesh, dtype=o.dtype), opt)

    def step(params, opt, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value

    cats = (["params"] * len(jax.tree.leaves(params)) + ["optimizer_state"] * len(jax.tree.leaves(opt))
            + ["batch"])
    return step, (params, opt, tokens), (0, 1), cats


def _fsdp(mesh, L=4, d=512, f=2048, B=16, T=64):
    """Weights sharded on a large dimension, batch sharded on the same axis: all-gathers."""
    params = {"w1": _sds((L, d, f), mesh, (None, "data", None)), "w2": _sds((L, f, d), mesh, (None, "data", None))}
    x = _sds((B, T, d), mesh, ("data", None, None))

    def layer(h, p):
        with jax.named_scope("mlp"):
            h = h + jax.nn.relu(h @ p["w1"]) @ p["w2"]
            return jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("data"))), None

    def loss(params, x):
        return jnp.mean(jax.lax.scan(layer, x, params)[0] ** 2)

    def step(params, x):
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params, x))

    return step, (params, x), (0,), ["params", "params", "batch"]


PROGRAMS = {
    "mlp": _mlp,
    "donated": lambda mesh: _mlp(mesh, donate=True),
    "transformer": _transformer,
    "fsdp": _fsdp,
}


@pytest.fixture(scope="module")
def gpu_mesh():
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(platform="cuda", target_config=H100, topology="1x1x8")
    except Exception as e:  # no CUDA plugin on this machine
        pytest.skip(f"deviceless CUDA compilation unavailable: {e}")
    return topologies.make_mesh(topo, (8,), ("data",))


@pytest.fixture(scope="module")
def cpu_mesh():
    if len(jax.devices("cpu")) < 8:
        pytest.skip("needs 8 host devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices("cpu")[:8])


class Compiled:
    def __init__(self, program, backend, mesh, dump_dir, **extra_options):
        step, args, donate, self.categories = PROGRAMS[program](mesh)
        lowered = jax.jit(step, donate_argnums=donate, keep_unused=True).lower(*args)
        options = {**dump.compile_options(dump_dir), **extra_options}
        t0 = time.perf_counter()
        self.compiled = lowered.compile(compiler_options=options)
        t1 = time.perf_counter()
        self.assignment = dump.read_dump(dump_dir)
        t2 = time.perf_counter()
        self.compile_s, self.decode_s = t1 - t0, t2 - t1
        self.stats = self.compiled.memory_analysis()
        self.args, self.backend, self.program, self.dump_dir = args, backend, program, dump_dir


_CACHE: dict = {}


@pytest.fixture(params=["cpu", "gpu"])
def backend(request):
    return request.param


def _compiled(program, backend, request, tmp_path_factory) -> Compiled:
    key = (program, backend)
    if key not in _CACHE:
        if backend == "gpu":
            mesh = request.getfixturevalue("gpu_mesh")
        else:
            mesh = request.getfixturevalue("cpu_mesh") if program == "fsdp" else None
        _CACHE[key] = Compiled(program, backend, mesh, tmp_path_factory.mktemp(f"{program}-{backend}"))
    return _CACHE[key]


@pytest.fixture(params=list(PROGRAMS))
def compiled(request, backend, tmp_path_factory) -> Compiled:
    return _compiled(request.param, backend, request, tmp_path_factory)


def test_peak_equals_xla_peak_memory(compiled):
    a, stats = compiled.assignment, compiled.stats
    assert a.peak_bytes == a.timeline.max() == a.timeline[a.peak_index]
    if compiled.backend == "gpu":
        # The deviceless GPU executable reports no serialized proto, only the peak: ours is it.
        assert stats.serialized_buffer_assignment_proto in (b"", None)
        if versions.gpu_peak_is_static():   # jaxlib 0.9: XLA's number is the static memory, as on the CPU
            assert a.timeline[0] == stats.peak_memory_in_bytes
        else:
            assert a.peak_bytes == stats.peak_memory_in_bytes
        assert a.peak_bytes > a.timeline[0]
        return
    # XLA:CPU computes peak_memory_in_bytes on a buffer assignment rebuilt from a proto
    # (BufferAssignment::FromProto), which has no heap-simulator traces: its "peak" is the static
    # memory alone. Decoding that very proto gives exactly that number; the dump, with its trace,
    # gives the same static memory plus the temporaries' curve.
    in_memory = hlo.decode_buffer_assignment(stats.serialized_buffer_assignment_proto)
    assert in_memory.peak_bytes == stats.peak_memory_in_bytes
    assert len(in_memory.timeline) == 1 and in_memory.traces == ()
    assert a.timeline[0] == stats.peak_memory_in_bytes
    assert sorted((b.id, b.size, b.allocation, b.offset) for b in in_memory.buffers) == \
        sorted((b.id, b.size, b.allocation, b.offset) for b in a.buffers)
    assert 0 < a.peak_bytes - a.timeline[0] <= stats.temp_size_in_bytes


def test_live_buffers_and_categories_sum_to_the_curve(compiled):
    a = compiled.assignment
    for i in sorted({0, a.peak_index, len(a.timeline) // 2, len(a.timeline) - 1}):
        assert sum(b.size for b in a.live_at(i)) == a.timeline[i]
    at_peak = a.categories_at(a.peak_index, compiled.categories)
    # "constants" only where XLA keeps one (XLA:CPU keeps a few bytes of them here)
    assert set(categories.CATEGORIES) <= set(at_peak) <= {*categories.CATEGORIES, "constants"}
    assert sum(at_peak.values()) == a.peak_bytes
    assert all((a.categorize(b, compiled.categories) == "constants") == b.is_constant for b in a.buffers)
    assert {a.categorize(b, compiled.categories) for b in a.buffers} <= {*categories.CATEGORIES, "constants"}


def _shard_shape(leaf) -> tuple[int, ...]:
    return tuple(leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape)


def test_entry_parameters_take_the_callers_categories(compiled):
    a = compiled.assignment
    at_start = a.categories_at(0, compiled.categories)
    expected: dict[str, int] = {}
    for leaf, cat in zip(jax.tree.leaves(compiled.args), compiled.categories, strict=True):
        expected[cat] = expected.get(cat, 0) + int(np.prod(_shard_shape(leaf))) * jnp.dtype(leaf.dtype).itemsize
    for cat, nbytes in expected.items():
        assert at_start[cat] == nbytes, cat
    shapes = {(b.parameter_number, b.shape, b.dtype) for b in a.buffers if b.opcode == "parameter" and b.is_parameter}
    for i, leaf in enumerate(jax.tree.leaves(compiled.args)):
        assert (i, _shard_shape(leaf), {"float32": "f32", "int32": "s32"}[jnp.dtype(leaf.dtype).name]) in shapes


def test_donation_shows_in_outputs(request, backend, tmp_path_factory):
    plain = _compiled("mlp", backend, request, tmp_path_factory).assignment
    donated = _compiled("donated", backend, request, tmp_path_factory).assignment
    cats = ["params"] * 6 + ["batch"] * 2
    param_bytes = (512 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10) * 4
    assert plain.categories_at(0, cats)["outputs"] >= param_bytes              # a second copy of the params
    assert donated.categories_at(0, cats)["outputs"] < 1024                    # only the output tuple's table
    aliased = [b for b in donated.buffers if b.is_parameter and b.live_out]
    assert sum(b.size for b in aliased if b.opcode == "parameter") == param_bytes


def test_logits_dominate_the_peak(request, backend, tmp_path_factory):
    c = _compiled("transformer", backend, request, tmp_path_factory)
    a = c.assignment
    top = a.live_at_peak()[0]
    assert "logits" in top.module_path, top
    assert top.size == 8 * 128 * 32768 * 4
    cats = a.categories_at(a.peak_index, c.categories)
    assert cats["activations"] > 0 and a.backward_start is not None
    assert any(b.module_path == "layers/attn" for b in a.buffers)
    assert any(b.module_path.startswith("layers/") and b.is_backward for b in a.buffers)


def test_fsdp_gathers_weights(request, backend, tmp_path_factory):
    a = _compiled("fsdp", backend, request, tmp_path_factory).assignment
    gathers = [b for b in a.buffers if b.collective and b.opcode.startswith("all-gather")]
    assert gathers
    assert any(b.shape in {(512, 2048), (2048, 512)} for b in gathers)       # one layer's full weight
    w1 = next(b for b in a.buffers if b.opcode == "parameter" and b.parameter_number == 0)
    assert w1.shape == (4, 64, 2048) and w1.dtype == "f32"
    if backend == "gpu":     # async-start / -done wrapping the reduce-scatters and all-to-alls
        # (jaxlib 0.12's XLA:GPU also runs fusions asynchronously: fusion-start, not a collective)
        wrapped = [b for b in a.buffers if b.opcode.startswith("async-") and not b.instruction.startswith("fusion")]
        assert wrapped and all(b.collective for b in wrapped)
    cats = ["params", "params", "batch"]
    seen = {a.categorize(b, cats) for i in range(len(a.timeline)) for b in a.live_at(i)}
    assert {"params", "batch", "collectives", "gradients"} <= seen


def test_chained_traces_still_match_xla(gpu_mesh, tmp_path):
    """NCCL user buffers get their own memory color: two heap traces, chained as XLA does."""
    c = Compiled("fsdp", "gpu", gpu_mesh, tmp_path, xla_gpu_enable_nccl_user_buffers=True)
    assert len(c.assignment.traces) == 2
    if versions.gpu_peak_is_static():   # jaxlib 0.9: XLA's number is the static memory alone
        assert c.assignment.timeline[0] == c.stats.peak_memory_in_bytes < c.assignment.peak_bytes
    else:
        assert c.assignment.peak_bytes == c.stats.peak_memory_in_bytes


def test_decoding_is_cheap_next_to_compiling(request, tmp_path_factory):
    c = _compiled("transformer", "gpu", request, tmp_path_factory)
    assert c.decode_s < 0.2 * c.compile_s, (c.decode_s, c.compile_s)


def test_dump_is_lean(request, tmp_path_factory):
    c = _compiled("transformer", "gpu", request, tmp_path_factory)
    names = os.listdir(c.dump_dir)
    assert any(n.endswith("after_optimizations.hlo.pb") for n in names)
    assert not [n for n in names if n.endswith((".dot", ".html", ".url")) or "after_optimizations.txt" in n
                or "buffer-assignment.txt" in n]


def test_read_dump_finds_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="compile_options"):
        dump.read_dump(tmp_path)


def test_read_dump_module_hint(request, tmp_path_factory):
    c = _compiled("mlp", "cpu", request, tmp_path_factory)
    assert dump.read_dump(c.dump_dir, "jit_step").peak_bytes == c.assignment.peak_bytes
    with pytest.raises(FileNotFoundError, match="nope"):
        dump.read_dump(c.dump_dir, "nope")


def test_a_loops_unnamed_input_takes_the_path_of_the_loop_that_carries_it():
    # XLA's zero-initialized stack of a scan's outputs (op_name "broadcast.90", no scope) shares its slice
    # with the while loop and the dynamic-update-slices that write each layer into it
    init = _buffer(id=1, instruction="loop_broadcast_fusion.5", op_name="broadcast.90", allocation=3, offset=64)
    loop = _buffer(id=2, instruction="while.85", opcode="while", module_path="Net/blocks", allocation=3, offset=64,
                   start=5, end=8)
    dus = _buffer(id=3, instruction="dus", module_path="Net/blocks/up", allocation=3, offset=64)
    later = _buffer(id=6, op_name="broadcast.92", allocation=3, offset=64, start=9, end=10)   # after the loop
    elsewhere = _buffer(id=4, op_name="broadcast.91", allocation=3, offset=0)   # another slice: stays unnamed
    param = _buffer(id=5, is_parameter=True, allocation=3, offset=64)
    out = {b.id: b.module_path for b in slice_paths([init, loop, dus, elsewhere, param, later])}
    assert out == {1: "Net/blocks", 2: "Net/blocks", 3: "Net/blocks/up", 4: "", 5: "", 6: ""}

