"""Probes of "Trust, round four" (issue 47) through the real CLI (and the API from a caller's script),
one row per input a new user tried: hostile config.json values, a step other than the one asked, cloud
hosts holding more GPUs than they have, the environment and outputs, batches past XLA's shapes, and the
API's types. tests/probe_cases.py adds them to PROBES; `python benchmarks/probes.py --round4` publishes
them alone (benchmarks/results/probes-round4.md).

Each class is also a test of the module that keeps the promise (tests/test_targets.py, test_env.py,
test_cli.py, test_sizes.py, test_api.py, test_precheck.py, test_models.py, and the config.json tests of
jaxmem/hf), so these rows are the benchmark's (bench_only): the suite runs the tests, not the rows twice.
"""

from __future__ import annotations

import json

from probe_cases import ROOT, TINY, Probe

LLAMA = str(ROOT / "models" / "llama.py")
MOE = str(ROOT / "models" / "moe.py")
MLP = str(ROOT / "tests" / "fixtures" / "mlp_small.py")
H100 = ("--gpu", "h100")
PRIME = "2147483629"   # below int32; twice it is not, and it splits into microbatches only one sequence each

# a small Llama-style config (tests/fixtures/hf/llama), each probe changing one field
_LLAMA_CONFIG = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                 "tie_word_embeddings": False}
_MISTRAL_CONFIG = {**_LLAMA_CONFIG, "model_type": "mistral", "sliding_window": 16}
_GEMMA3_CONFIG = {**_LLAMA_CONFIG, "model_type": "gemma3_text", "head_dim": 32, "query_pre_attn_scalar": 32,
                  "sliding_window": 16, "sliding_window_pattern": 6, "rope_local_base_freq": 10000.0,
                  "hidden_activation": "gelu_pytorch_tanh"}


def _config(base: dict, raw: str | None = None, **fields) -> tuple[tuple[str, bytes], ...]:
    """config.json in the probe's folder: `base` with `fields`, or `raw` JSON text spliced in last (10^400
    as digits, which json.dumps would not write from a float)."""
    text = json.dumps({**base, **fields})
    if raw is not None:
        text = text[:-1] + ", " + raw + "}"
    return (("config.json", text.encode()),)


def _cli_after(setup: str, argv: str) -> tuple[str, ...]:
    """`python -c`: `setup` (Python lines; `tmp` is the probe's folder), then the CLI with `argv`."""
    return ("-c", "\n".join(("import os, sys", "tmp = os.environ['PROBE_TMP']", setup, f"sys.argv = ['jaxmem', {argv}]",
                             "from jaxmem.cli import entry", "entry()")))


# The config probes run under an 8 GiB address-space cap (inherited by the compile child): a config that
# grew jaxmem to 20 GB before the OOM killer came (issue 47) ends in a MemoryError, a broken promise the table
# shows, not a shared machine out of memory. A tiny config's analysis runs under it (0.8 GB peak RSS).
_CAP = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))"


def _cfg_probe(name: str, code: int, message: str | None, files, *extra: str, exits: tuple[int, ...] = (),
               cls: str = "3. config values reach arithmetic", checks: tuple[str, ...] = ("fast:60",)) -> Probe:
    argv = ", ".join(map(repr, ("analyze", *H100, "--no-explain", *extra)))
    return Probe(name, (), code, message, files=files,
                 argv=_cli_after(_CAP, f"{argv}, os.path.join(tmp, 'config.json')"), env=(("PROBE_TMP", "{tmp}"),),
                 cls=cls, process=True, exits=exits, checks=checks, compiles=code in (0, 3), bench_only=True)


CONFIG = [
    # 2. a config that exhausts the machine: a verdict (or exit 2 naming the field), under 2 GiB of jaxmem's own
    *[_cfg_probe(f"config num_hidden_layers {n}", 3, None, _config(_LLAMA_CONFIG, num_hidden_layers=v), exits=(2,),
                 cls="2. a config that exhausts the machine", checks=("fast:60", "round2:rss_below:2048"))
      for n, v in (("10^9", 10**9), ("2^31", 2**31))],
    # 3. values that reached arithmetic unchecked: exit 2 naming the field (or a verdict where the value is valid)
    _cfg_probe("config vocab_size 10^12", 2, "vocab_size", _config(_LLAMA_CONFIG, vocab_size=10**12), exits=(3,)),
    _cfg_probe("config vocab_size 0", 2, "vocab_size", _config(_LLAMA_CONFIG, vocab_size=0)),
    _cfg_probe("config head_dim 10^10", 2, "head_dim", _config(_LLAMA_CONFIG, head_dim=10**10), exits=(3,)),
    _cfg_probe("config hidden_size 10^400", 2, "hidden_size",
               _config(_LLAMA_CONFIG, raw=f'"hidden_size": 1{"0" * 400}')),
    _cfg_probe("config hidden_size 0", 2, "hidden_size", _config(_LLAMA_CONFIG, hidden_size=0)),
    _cfg_probe("config num_hidden_layers 0", 2, "num_hidden_layers", _config(_LLAMA_CONFIG, num_hidden_layers=0)),
    _cfg_probe("config num_attention_heads 0", 2, "num_attention_heads",
               _config(_LLAMA_CONFIG, num_attention_heads=0)),
    _cfg_probe("config model_type a list", 2, "model_type", _config(_LLAMA_CONFIG, model_type=["llama"])),
    _cfg_probe("config model_type a dict", 2, "model_type", _config(_LLAMA_CONFIG, model_type={"name": "llama"})),
    # a window wider than the sequence is a legitimate config: unbounded, and a verdict
    *[_cfg_probe(f"config mistral sliding_window {n}: a verdict", 0, None, _config(_MISTRAL_CONFIG, sliding_window=v),
                 exits=(3,)) for n, v in (("10^12", 10**12), ("2^31", 2**31))],
    _cfg_probe("config gemma3 sliding_window_pattern 0", 2, "sliding_window_pattern",
               _config(_GEMMA3_CONFIG, sliding_window_pattern=0)),
    # 4. the step analyzed is the step asked
    *[_cfg_probe(f"config --arg {arg}=0", 2, arg, _config(_LLAMA_CONFIG), "--arg", f"{arg}=0",
                 cls="4. an answer for another step") for arg in ("seq_len", "batch_size")],
]

HOSTS = [
    Probe("--gpu a3-highgpu-8g --mesh data=16 --hosts 1", ("analyze", TINY, "--gpu", "a3-highgpu-8g", "--mesh",
                                                           "data=16", "--hosts", "1"), 2,
          "each a3-highgpu-8g machine, which holds 8 GPUs", cls="5. hosts with more GPUs than they hold",
          bench_only=True),
    Probe("--gpu p5.48xlarge --mesh fsdp=64 --hosts 2", ("analyze", TINY, "--gpu", "p5.48xlarge", "--mesh",
                                                          "fsdp=64", "--hosts", "2"), 2,
          "each p5.48xlarge machine, which holds 8 GPUs", cls="5. hosts with more GPUs than they hold",
          bench_only=True),
    Probe("--mesh data=9 on a3-highgpu-8g without --hosts: 3 hosts, no --hosts quoted",
          ("analyze", MLP, "--gpu", "a3-highgpu-8g", "--mesh", "data=9", "--batch", "18", "--no-explain"), 0, None,
          checks=("stdout:3 hosts", "no_text:--hosts"), cls="5. hosts with more GPUs than they hold",
          compiles=True, bench_only=True),
]

# a planted, empty "these XLA_FLAGS are good" memo in the cache, then the CLI with the bad flag
_PLANT = _cli_after("from jaxmem import env\nd = os.path.join(tmp, 'xla-flags-ok')\nos.makedirs(d)\n"
                    "open(os.path.join(d, env._memo_key(os.environ['XLA_FLAGS'])), 'wb').close()",
                    f"'analyze', {TINY!r}, '--gpu', 'h100', '--no-explain'")

ENVIRONMENT = [
    Probe("XLA_FLAGS='   '", ("analyze", TINY, *H100, "--no-explain"), 2, "XLA_FLAGS='   ' is blank",
          env=(("XLA_FLAGS", "   "),), cls="6. environment and outputs", process=True, bench_only=True),
    Probe("XLA_FLAGS device count 99999999999", ("analyze", TINY, "--gpu", "cpu", "--no-explain"), 2,
          "--xla_force_host_platform_device_count=99999999999: XLA's CPU backend needs between 1 and 2^31 - 1",
          env=(("XLA_FLAGS", "--xla_force_host_platform_device_count=99999999999"),),
          cls="6. environment and outputs", process=True, bench_only=True),
    Probe("a planted empty XLA_FLAGS memo, then a bad flag", (), 2, "XLA knows no flag --xla_bogus_flag=1",
          argv=_PLANT, env=(("XLA_FLAGS", "--xla_bogus_flag=1"), ("JAXMEM_CACHE", "{tmp}"), ("PROBE_TMP", "{tmp}")),
          cls="6. environment and outputs", process=True, bench_only=True),
    *[Probe(f"gpus{' --json' if j else ''} > /dev/full", ("gpus", *(["--json"] if j else [])), 2,
            "cannot write the output (stdout): No space left on device", stdout_to="/dev/full",
            cls="6. environment and outputs", process=True, bench_only=True) for j in (False, True)],
]

BATCHES = [
    Probe(f"--batch {PRIME} on the tiny Llama", ("analyze", LLAMA, "--arg", "preset=tiny", *H100, "--batch", PRIME),
          2, "XLA:GPU runs a matmul's batch dimensions as one", checks=("fast:30",),
          cls="7. a batch XLA cannot shape", process=True, bench_only=True),
    Probe(f"--batch {PRIME} --mesh stage=2 on the tiny Llama", ("analyze", LLAMA, "--arg", "preset=tiny", *H100,
                                                                "--batch", PRIME, "--mesh", "stage=2"),
          2, "the pipeline's loop runs 2,147,483,630 iterations", checks=("fast:30",),
          cls="7. a batch XLA cannot shape", process=True, bench_only=True),
    Probe("--accum 1000003 on the tiny Llama", ("analyze", LLAMA, "--arg", "preset=tiny", *H100, "--batch",
                                                "1000003", "--accum", "1000003"),
          2, "the gradient accumulation loop runs 1,000,003 iterations", checks=("fast:30",),
          cls="7. a batch XLA cannot shape", process=True, bench_only=True),
]


def _api(call: str) -> tuple[str, ...]:
    """`python -c`: a caller's script making one API call; a UserError is its message and exit 2."""
    return ("-c", "\n".join(("import os, sys", "import numpy as np", "import jaxmem",
                             "tmp = os.environ.get('PROBE_TMP', '')", "try:", f"    jaxmem.{call}",
                             "except jaxmem.UserError as e:", "    print(f'error: {e}', file=sys.stderr)",
                             "    sys.exit(2)", "print('REPORT')")))


API = [
    Probe("API lora=True", (), 2, "lora=True: True is not a number", argv=_api(f"analyze({TINY!r}, gpu='h100', "
                                                                               "lora=True)"),
          cls="8. the API's types and path messages", process=True, bench_only=True),
    Probe("API mem_fraction=True", (), 2, "mem_fraction=True: True is not a number",
          argv=_api(f"analyze({TINY!r}, gpu='h100', mem_fraction=True)"),
          cls="8. the API's types and path messages", process=True, bench_only=True),
    Probe("API np.int64 batch_size of a config.json", (), 0, None, files=_config(_LLAMA_CONFIG),
          argv=_api("analyze(os.path.join(tmp, 'config.json'), gpu='h100', explain=False, "
                    "args={'batch_size': np.int64(4), 'seq_len': np.int64(32)})"),
          env=(("PROBE_TMP", "{tmp}"),), checks=("stdout:REPORT",), cls="8. the API's types and path messages",
          process=True, compiles=True, bench_only=True),
    Probe("--arg capacity_factor=inf on models/moe.py", ("analyze", MOE, "--arg", "preset=tiny", "--arg",
                                                         "capacity_factor=inf", *H100), 2,
          "moe: capacity_factor=inf must be a positive, finite number", checks=("no_text:axes_scan",),
          cls="8. the API's types and path messages", bench_only=True),
    Probe("a dangling symbolic link as the model file", (), 2, "is a symbolic link to",
          checks=("no_text:did you mean",),
          argv=_cli_after("os.symlink('/nonexistent/model.py', os.path.join(tmp, 'link.py'))",
                          "'analyze', os.path.join(tmp, 'link.py')"),
          env=(("PROBE_TMP", "{tmp}"),), cls="8. the API's types and path messages", process=True, bench_only=True),
    Probe("a folder whose config.json links to /dev/zero", (), 2, "holds config.json, which is not a regular file",
          checks=("no_text:is a directory",),
          argv=_cli_after("os.mkdir(os.path.join(tmp, 'model'))\n"
                          "os.symlink('/dev/zero', os.path.join(tmp, 'model', 'config.json'))",
                          "'analyze', os.path.join(tmp, 'model')"),
          env=(("PROBE_TMP", "{tmp}"),), cls="8. the API's types and path messages", process=True, bench_only=True),
]

ROUND4 = CONFIG + HOSTS + ENVIRONMENT + BATCHES + API
