"""The environment jax and XLA read, checked before jax starts (jaxmem/env.py): each bad setting is
one UserError naming the variable (or option) and the fix, never an abort, a traceback or a hang."""
import http.server
import socket
import threading
import time

import pytest

from jaxmem import env
from jaxmem.errors import UserError


def test_jax_platforms_unknown_or_unavailable_is_named(monkeypatch):
    with pytest.raises(UserError, match=r"JAX_PLATFORMS=bogus: jax knows no platform 'bogus'.*unset JAX_PLATFORMS"):
        env.check_platforms({"JAX_PLATFORMS": "bogus"})
    monkeypatch.setattr(env, "_platform_available", lambda n: n == "cpu")
    with pytest.raises(UserError, match=r"JAX_PLATFORMS=cuda: this machine has no NVIDIA GPU .*unset JAX_PLATFORMS"):
        env.check_platforms({"JAX_PLATFORMS": "cuda"})
    env.check_platforms({"JAX_PLATFORMS": "cuda,cpu"})   # jax falls back to the CPU: fine
    env.check_platforms({"JAX_PLATFORMS": "cpu"})
    monkeypatch.setattr(env, "_platform_available", lambda n: True)
    env.check_platforms({"JAX_PLATFORMS": "cuda"})       # a machine with a GPU


def test_preallocate_typo_is_named():
    with pytest.raises(UserError, match="XLA_PYTHON_CLIENT_PREALLOCATE='flase'.*write true or false"):
        env.check({"XLA_PYTHON_CLIENT_PREALLOCATE": "flase"})
    env.check({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})


@pytest.mark.parametrize("flags,message", [
    ("--xla_bogus_flag=1", r"XLA_FLAGS: XLA knows no flag --xla_bogus_flag=1; fix or remove it"),
    ("--xla_gpu_enable_triton_gemm=maybe", r"--xla_gpu_enable_triton_gemm=maybe: XLA cannot read the value 'maybe'"),
    ("xla_gpu_enable_triton_gemm=false", r"does not start with '--', so XLA takes it for a file of flags"),
])
def test_xla_flags_xla_would_abort_on_are_named(tmp_path, monkeypatch, flags, message):
    monkeypatch.setenv("JAXMEM_CACHE", str(tmp_path))
    with pytest.raises(UserError, match=message):
        env.check_xla_flags({"XLA_FLAGS": flags, "PATH": "/usr/bin:/bin"})
    assert not (tmp_path / "xla-flags-ok").exists()      # a bad string is never remembered as good


def test_good_xla_flags_are_probed_once(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("JAXMEM_CACHE", str(tmp_path))
    good = {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false --xla_force_host_platform_device_count=2"}
    env.check_xla_flags(good)
    assert len(list((tmp_path / "xla-flags-ok").iterdir())) == 1

    def no_probe(*a, **k):
        raise AssertionError("probed again")

    monkeypatch.setattr(subprocess, "run", no_probe)
    env.check_xla_flags(good)
    env.check_xla_flags({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})   # jaxmem's own: no probe


@pytest.mark.parametrize("flags", ["   ", "\t", " \n "])
def test_a_blank_xla_flags_is_refused_without_a_probe(monkeypatch, flags):
    # issue 47: XLA_FLAGS='   ' ended in XLA's fatal "Could not open file" line (XLA reads it as a file of flags)
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("probed"))
    with pytest.raises(UserError, match=r"XLA_FLAGS='.*' is blank: XLA takes a value that does not start with '--' "
                                        r"for the name of a file of flags.*unset XLA_FLAGS"):
        env.check({"XLA_FLAGS": flags})
    env.check_xla_flags({"XLA_FLAGS": ""})   # empty is unset


def test_a_host_device_count_past_int32_is_refused_without_a_probe(monkeypatch):
    # jaxmem's own flag skips the probe: 99999999999 aborted XLA ("Flag parsing failed"), exit 1
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("probed"))
    for count in ("99999999999", "2147483648", "0"):
        with pytest.raises(UserError, match=rf"--xla_force_host_platform_device_count={count}: XLA's CPU backend "
                                            r"needs between 1 and 2\^31 - 1 devices"):
            env.check_xla_flags({"XLA_FLAGS": f"--xla_force_host_platform_device_count={count}"})
    env.check_xla_flags({"XLA_FLAGS": "--xla_force_host_platform_device_count=2147483647"})


def test_a_planted_xla_flags_memo_vouches_for_nothing(tmp_path, monkeypatch):
    # issue 47: an empty file under the flags' memo name in a shared cache made a bad flag skip the probe (XLA then
    # aborted, exit 1); the memo is signed with the cache's key as every compile-cache entry is
    import shutil
    import subprocess

    def xla(args, env, **kw):   # the probe, as XLA answers it (tests above run the real one)
        bogus = "--xla_bogus_flag" in env["XLA_FLAGS"]
        return subprocess.CompletedProcess(args, int(bogus), "", "Unknown flags in XLA_FLAGS: --xla_bogus_flag=1"
                                           if bogus else "")

    monkeypatch.setattr(subprocess, "run", xla)
    monkeypatch.setenv("JAXMEM_CACHE", str(tmp_path))
    bad = {"XLA_FLAGS": "--xla_bogus_flag=1", "PATH": "/usr/bin:/bin"}
    planted = tmp_path / "xla-flags-ok" / env._memo_key(bad["XLA_FLAGS"])
    planted.parent.mkdir()
    for content in (b"", b"0" * 64, env._memo_digest(b"another cache's key" + bytes(13), planted.name)):
        planted.write_bytes(content)
        with pytest.raises(UserError, match="XLA knows no flag --xla_bogus_flag=1"):
            env.check_xla_flags(bad)
    # a good string's memo, copied under the bad string's name, is no memo for it either
    good = {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false", "PATH": "/usr/bin:/bin"}
    env.check_xla_flags(good)
    shutil.copy(tmp_path / "xla-flags-ok" / env._memo_key(good["XLA_FLAGS"]), planted)
    with pytest.raises(UserError, match="XLA knows no flag --xla_bogus_flag=1"):
        env.check_xla_flags(bad)
    planted.unlink()
    planted.symlink_to(tmp_path / "xla-flags-ok" / env._memo_key(good["XLA_FLAGS"]))   # a link is not a memo
    with pytest.raises(UserError, match="XLA knows no flag --xla_bogus_flag=1"):
        env.check_xla_flags(bad)


def test_ray_addresses_that_are_not_addresses(monkeypatch):
    for address, message in (("nohost", "is not HOST:PORT"), ("host:99999", "is not HOST:PORT"),
                             ("http://head:8265", "Ray does not connect over http://")):
        with pytest.raises(UserError, match=f"--ray-address '{address}'.*{message}"):
            env.check_ray_address(address, "--ray-address")
    import builtins

    real_import = builtins.__import__

    def no_grpc(name, *a, **k):
        if name == "grpc":
            raise ImportError("No module named 'grpc'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_grpc)
    with pytest.raises(UserError, match=r"RAY_ADDRESS 'ray://head:10001': a ray:// address needs Ray Client: "
                                        r"pip install 'ray\[client\]'"):
        env.check_ray_address("ray://head:10001", "RAY_ADDRESS")


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):   # the probe's output is jaxmem's, not the server's
        pass


def test_ray_addresses_nobody_answers_give_up_fast():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                            # nothing listens there now
    t0 = time.monotonic()
    with pytest.raises(UserError, match=f"--ray-address '127.0.0.1:{port}': cannot reach the Ray cluster"):
        env.check_ray_address(f"127.0.0.1:{port}", "--ray-address")
    server = http.server.HTTPServer(("127.0.0.1", 0), _QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(UserError, match="something answers at 127.0.0.1:.*, but not Ray"):
            env.check_ray_address(f"127.0.0.1:{server.server_port}", "--ray-address")
    finally:
        server.shutdown()
    assert time.monotonic() - t0 < 2 * env.RAY_CONNECT_S


def test_jax_persistent_cache_does_not_answer_jaxmem(tmp_path):
    """JAX_COMPILATION_CACHE_DIR: a second --gpu cpu run was answered by JAX's cache, with no
    buffer assignment ("this HloProto has no buffer_assignment"). jaxmem turns it off for its compiles."""
    import jax
    from jax._src import compilation_cache

    from jaxmem.pipeline import AnalyzeOptions, analyze_file

    saved = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir",
                                                  "jax_persistent_cache_min_compile_time_secs",
                                                  "jax_persistent_cache_min_entry_size_bytes")}
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jcc"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()
    try:
        opts = AnalyzeOptions(gpu="cpu", model_args=(("width", 24),), cache=False)
        first = analyze_file("tests/fixtures/mlp_small.py", opts)
        jax.clear_caches()
        second = analyze_file("tests/fixtures/mlp_small.py", opts)
        assert second.per_device_peak_bytes == first.per_device_peak_bytes and second.top_buffers
        assert compilation_cache.is_persistent_cache_enabled()   # the caller's setting is left as it was
    finally:
        for k, v in saved.items():
            jax.config.update(k, v)
        compilation_cache.reset_cache()
