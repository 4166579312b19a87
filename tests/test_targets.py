import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxmem.compiler import targets
from jaxmem.errors import UserError
from jaxmem.program.layouts import build_mesh, parse_mesh


def test_aliases_and_unknown():
    assert targets.resolve_gpu_name("A100") == "a100-80g"
    assert targets.resolve_gpu_name("h100-sxm") == "h100"
    with pytest.raises(UserError, match=r"unknown GPU 'v100'.*h100.*rtx-a6000"):
        targets.resolve_gpu_name("v100")


def test_default_is_h100_without_a_gpu():
    assert targets.resolve_gpu_name(None) == "h100"


def test_a_cloud_machine_type_is_its_card_with_the_hosts_own_network_and_memory():
    from jaxmem.compiler import catalogue

    assert targets.resolve_gpu_name("A3 High") == targets.resolve_gpu_name("a3-highgpu-8g") == "a3-highgpu-8g"
    assert targets.resolve_gpu_name("p5") == "p5.48xlarge"
    # the card's own name (what a device reports) still finds the card, not a host built on it
    assert targets.resolve_gpu_name("NVIDIA H100 80GB HBM3") == "h100"
    for h in catalogue.CLOUD_HOSTS:
        spec, card = targets.CATALOGUE[h.key], targets.CATALOGUE[h.card]
        assert spec.target_config() == card.target_config() and spec.memory_bytes == card.memory_bytes, h.key
        p, base = targets.performance(h.key), targets.performance(h.card)
        assert (p.bf16_flops, p.hbm_bandwidth, p.intra_host_bandwidth) == (
            base.bf16_flops, base.hbm_bandwidth, base.intra_host_bandwidth), h.key
        assert p.inter_host_bandwidth == h.network_per_gpu and p.host_memory == h.host_memory, h.key
        assert sum("inter_host_bandwidth" in f for f, _ in p.sources) == 1, h.key   # the host's source, not the DGX's
    # A3 High: 4 x 200 Gb/s for 8 GPUs = 12.5 GB/s per GPU, a quarter of a DGX H100's NIC per GPU
    assert targets.performance("a3-highgpu-8g").inter_host_bandwidth == 12.5e9
    assert targets.performance("h100").inter_host_bandwidth == 50e9


def test_a_gradient_all_reduce_across_a3_high_hosts_is_timed_at_their_nics():
    from jaxmem.compiler import rates
    from jaxmem.xla.collectives import Collective

    # 16 replicas, one per host (device i of each of 16 hosts of 8): DP across hosts, as HSDP's data axis
    groups = tuple(tuple(h * 8 + i for h in range(16)) for i in range(8))
    c = Collective("all-reduce", 2 * 2**30, groups, ("data",), 1)
    times = {}
    for gpu in ("h100", "a3-highgpu-8g"):
        perf = targets.performance(gpu)
        r = rates.rates(gpu, perf)
        times[gpu], link = rates.collective_time(c, perf, r, 8, r.nvls)
        assert link == "network"
    # the same bytes over a quarter of the bandwidth: about 4x the time (latency aside)
    assert 3.5 < times["a3-highgpu-8g"] / times["h100"] <= 4.0


@pytest.mark.parametrize("gpu", sorted(k for k in targets.CATALOGUE if targets.card_of(k) == k))
def test_every_catalogue_gpu_compiles_a_sharded_step(gpu):
    # docs/how-it-works.md §1: a field newer than jaxlib's proto breaks text parsing; compile each config we ship.
    target = targets.make_target(gpu, 8)
    assert target.deviceless and len(target.devices) == 8
    assert target.devices[0].device_kind == targets.CATALOGUE[gpu].description
    mesh = build_mesh(target.devices, parse_mesh("data=8"))
    w = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P(None, "data")))
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    c = jax.jit(jax.grad(lambda w, x: jnp.tanh(x @ w).sum())).lower(w, x).compile()
    assert c.memory_analysis().temp_size_in_bytes > 0


def test_multi_host_topology():
    assert targets.topology_string(32, None) == ("1x4x8", 4)
    assert targets.topology_string(256, None) == ("1x32x8", 32)
    assert targets.topology_string(4, None) == ("1x1x4", 1)
    with pytest.raises(UserError, match="does not divide"):
        targets.topology_string(12, 5)
    t = targets.make_target("h100", 32)
    assert t.hosts == 4 and len(t.devices) == 32


def test_cpu_target_needs_enough_host_devices():
    assert len(targets.make_target("cpu", 8).devices) == 8
    with pytest.raises(UserError, match="xla_force_host_platform_device_count=64"):
        targets.make_target("cpu", 64)


def test_local_without_gpu_says_so():
    with pytest.raises(UserError, match="no GPU is attached"):
        targets.make_target("local", 1)


def test_usable_fraction_follows_jax_env(monkeypatch):
    for var in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.delenv(var, raising=False)
    assert targets.usable_fraction()[0] == 0.75
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
    assert targets.usable_fraction()[0] == 0.9
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    assert targets.usable_fraction()[0] == 1.0


NEW_CARDS = ("rtx-3090", "rtx-4090", "rtx-5090", "rtx-6000-ada", "rtx-pro-6000", "l40s", "l4", "a10g", "a100-40g",
             "h100-pcie", "h100-nvl", "h20", "b300")


@pytest.mark.parametrize("spelling, key", [("4090", "rtx-4090"), ("rtx4090", "rtx-4090"), ("RTX 4090", "rtx-4090"),
                                           ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("rtx-pro-6000", "rtx-pro-6000"),
                                           ("RTX PRO 6000", "rtx-pro-6000"), ("L40S", "l40s"), ("l40s", "l40s"),
                                           ("H100 PCIe", "h100-pcie"), ("A100-40G", "a100-40g"), ("3090", "rtx-3090")])
def test_common_spellings_of_a_card_resolve(spelling, key):
    assert targets.resolve_gpu_name(spelling) == key


def test_every_card_names_a_source_for_each_figure_and_consumer_cards_say_they_have_no_peer_access():
    rows = {r["name"]: r for r in targets.catalogue_rows()}
    assert set(NEW_CARDS) <= set(rows)
    for name, r in rows.items():
        named = " ".join(s["fields"] for s in r["sources"])
        for field in ("memory_bytes", "compute_capability", "memory_bandwidth"):
            assert field in named, (name, field)
    for name in NEW_CARDS:   # FP8 where the card has it: Ada (8.9) and later
        major, minor = map(int, rows[name]["compute_capability"].split("."))
        assert (rows[name]["performance"]["fp8_flops"] is not None) == ((major, minor) >= (8, 9)), name
    for name in ("rtx-3090", "rtx-4090", "rtx-5090"):
        p = targets.PERFORMANCE[name]
        assert not p.peer_to_peer and p.intra_host_bandwidth == p.host_bandwidth / 2
    assert targets.PERFORMANCE["h20"].intra_host_link.startswith("NVLink")
    assert "PCIe" in targets.PERFORMANCE["l40s"].intra_host_link and targets.PERFORMANCE["l40s"].peer_to_peer


def test_a_cloud_machine_type_holds_no_more_devices_per_host_than_its_gpus():
    # issue 47: 16 GPUs in one a3-highgpu-8g, 32 in a p5.48xlarge were accepted, their collectives timed over NVLink
    from jaxmem import precheck

    with pytest.raises(UserError, match=r"--hosts 1 puts 16 .* each a3-highgpu-8g machine, which holds 8 GPUs; "
                                        r"give --hosts 2"):
        precheck.mesh("data=16", gpu_name="a3-highgpu-8g", hosts=1)
    with pytest.raises(UserError, match=r"--hosts 2 puts 32 .* each p5.48xlarge machine, which holds 8 GPUs; "
                                        r"give --hosts 8"):
        precheck.mesh("fsdp=64", gpu_name="p5", hosts=2)
    with pytest.raises(UserError, match="which holds 8 GPUs"):   # the API's and the pipeline's way in
        targets.make_target("a3-highgpu-8g", 16, 1)
    precheck.mesh("data=16", gpu_name="a3-highgpu-8g", hosts=2)
    precheck.mesh("data=16", gpu_name="h100", hosts=1)   # a card's host is the user's to size
    assert [r["gpus_per_machine"] for r in targets.catalogue_rows() if r["name"] == "p5.48xlarge"] == [8]


def test_hosts_default_from_the_machine_type_and_never_quote_a_hosts_not_given():
    # issue 47: `--mesh data=9` without --hosts was "--hosts 2 does not divide the 9 devices of the mesh"
    assert targets.host_count(9, None, "a3-highgpu-8g") == 3
    assert targets.host_count(16, None, "p5.48xlarge") == 2
    assert targets.host_count(12, None) == 2 and targets.host_count(8, None) == 1
    for n in range(1, 300):
        h = targets.host_count(n, None, "a3-highgpu-8g")
        # the fewest hosts of at most 8 devices each that divide the mesh
        assert n % h == 0 and n // h <= 8 and not any(n % k == 0 and n // k <= 8 for k in range(1, h)), n
    assert targets.topology_string(9, None, "h100") == ("1x3x3", 3)
