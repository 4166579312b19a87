"""Compiling only as far as the memory answer needs: stopping XLA:GPU after buffer assignment.

A deviceless XLA:GPU compile runs the HLO passes, assigns buffers, and then emits LLVM IR and
compiles every kernel to PTX and a cubin: about a fifth of the compile (gpt2-medium on 8 x H100:
8.3 s of 43 s, benchmarks/results/planning.md) that no memory number depends on. XLA has no
option to stop after buffer assignment, so the compile runs in a child process, and the parent
stops it the moment XLA has written the buffer-assigned module (the ``after_optimizations`` dump
with its buffer assignment; XLA writes its memory-usage report right after it, in the same
thread, before any kernel is emitted). Everything jaxmem reads from a compile comes from that
dump: XLA's memory numbers (:mod:`jaxmem.xla.memory_stats`), the buffer assignment, and the
optimized HLO text (the module printed from the dump: only the module-config attributes of its
header line differ from ``compiled.as_text()``). tests/test_early_stop.py compiles shipped models
both ways and asserts identical numbers, buffers and HLO.

The child is started before the parent traces the step (:meth:`Child.start`), so its jax import
and topology overlap the tracing. It receives exactly what JAX would have handed XLA: the parent
runs ``lowered.compile`` with XLA's entry point intercepted, and sends the StableHLO module, the
serialized CompileOptions and the device ids. The user's model never runs in the child: a
custom-partitioned op's rules (cuDNN attention, ...) are Python callbacks that XLA calls while it
partitions the program, and the child forwards each to the parent, which answers it with JAX's
own functions (:mod:`jaxmem.compiler.partitioners`). The child dies with its parent
(PR_SET_PDEATHSIG on Linux, and EOF on its stdin everywhere).

Once the dump is there the child has one more job: printing the optimized module as HLO text and
costing it (:func:`print_module`, 0.4 s for gpt2-medium's 55k instructions), while the parent decodes
the buffer assignment; XLA's backend, still compiling kernels in the child, gets the lowest
priority meanwhile, and the child ends itself once it has sent the text. A child that cannot
print leaves it to the parent, which prints the same text from the same dump.

Both directions carry length-prefixed pickles (:func:`_send`, :func:`_receive`): parent to child
the compile request, the answers to its callbacks, then the dump to print; child to parent the
callbacks' questions, XLA's error if it fails, then the printed module.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import queue
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

import jax
from jax._src import compiler as jax_compiler
from jax._src.interpreters import mlir
from jax._src.lib import xla_client as xc
from jax._src.lib.mlir import ir
from jax.experimental import topologies

from jaxmem import env, session
from jaxmem.compiler import partitioners, steptime, targets, versions
from jaxmem.xla import dump, memory_stats

_POLL_S = 0.02
_PRINT_TIMEOUT_S = 60.0   # the child's print of the module (about 0.5 s for 55k instructions); then printed here
_HEADER = struct.Struct(">Q")


def _send(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))   # apart: joined, a module's bytecode would be copied once more
    stream.write(data)
    stream.flush()


def _receive(stream):
    """The next message on `stream`; EOFError when it ends (between or inside a message)."""
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = stream.read(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    (size,) = _HEADER.unpack(exactly(_HEADER.size))
    return pickle.loads(exactly(size))


class Unsupported(Exception):
    """This jax/jaxlib lacks what the early stop relies on (an entry point moved, no dump written):
    the caller compiles whole instead, with a note naming what is missing."""


class _Captured(Exception):
    """Raised in place of XLA's compile: what JAX would have compiled."""


def applies(target) -> bool:
    """Only deviceless XLA:GPU compiles are stopped early: a CPU compile has no comparable backend
    cost and `verify` runs what it compiles; a local GPU's executable may be wanted whole."""
    return target is not None and target.platform == "cuda" and target.deviceless


def capture(lowered, compiler_options: dict) -> dict:
    """The request XLA would receive for ``lowered.compile(compiler_options=...)``."""

    missing = [name for owner, name in ((jax_compiler, "backend_compile_and_load"), (mlir, "module_to_bytecode"))
               if not hasattr(owner, name)]
    if missing:
        raise Unsupported(f"jax {jax.__version__} has no {', '.join(missing)} (the early-stopped compile's entry)")

    def grab(backend, module, executable_devices, options, host_callbacks):
        if host_callbacks:
            raise RuntimeError("the step has host callbacks, which a compile in another process cannot serve")
        raise _Captured({"module": mlir.module_to_bytecode(module), "options": options.SerializeAsString(),
                         "device_ids": [d.id for d in executable_devices]})

    saved = jax_compiler.backend_compile_and_load
    jax_compiler.backend_compile_and_load = grab
    try:
        lowered.compile(compiler_options=compiler_options)
    except _Captured as c:
        return c.args[0]
    finally:
        jax_compiler.backend_compile_and_load = saved
    raise RuntimeError("jax compiled the step without calling XLA (its persistent compilation cache answered?); "
                       "unset JAX_COMPILATION_CACHE_DIR for jaxmem")


class CompileFailed(Exception):
    """XLA's error in the child (its first lines), or how the child died."""


class Child:
    """One compile in a child process, stopped after buffer assignment."""

    def __init__(self, target_config: str, topology: str, *, now: bool = True):
        self.args = (target_config, topology)
        self._proc: subprocess.Popen[bytes] | None = None
        self._answered: dict[bytes, tuple] = {}   # partitioning questions already answered (partitioners.serve)
        self._reaped = False   # killed after its dump, and left to a reaper thread (_kill_and_reap)
        self._printing = False   # asked to print the dumped module (_ask_to_print): printed() collects it
        if now:
            self._spawn()

    def _spawn(self) -> None:
        target_config, topology = self.args
        self._log = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 -- the child's stderr, read while it lives
        # the child imports this jaxmem, wherever it was imported from (an install, a checkout)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "jaxmem.compiler.early_stop", target_config, topology],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            env=session.child_environment(**{env.SWITCH: "1"}, JAXMEM_COMPILE_PARENT=str(os.getpid())))

    @property
    def _child(self) -> subprocess.Popen[bytes]:
        """The child process, once spawned (by __init__ or compile)."""
        assert self._proc is not None, "the child is spawned first"
        return self._proc

    @classmethod
    def start(cls, target, *, now: bool = True, device_memory: int | None = None) -> Child:
        """A child for `target`. now: start it at once (its jax import then overlaps the caller's
        tracing, which pays when a core is idle); else when the compile is sent, so that a cache
        hit costs nothing (sweep workers: every core is busy anyway). `device_memory`: the device memory
        XLA compiles for, when not the target's (targets.target_config)."""

        topo, _ = targets.topology_string(len(target.devices), target.hosts)
        return cls(targets.target_config(target, device_memory), topo, now=now)

    def compile(self, request: dict, dump_dir: str) -> tuple[bytes, str]:
        """Send the request (emptied once sent); return (the after-optimizations HloProto, XLA's log) as soon as XLA
        has written it, stopping the compile there. The child is then asked to print the module
        (see :meth:`printed`, which stops it). Raises CompileFailed."""
        if self._proc is None:
            self._spawn()
        try:
            _send(self._child.stdin, request)
        except (BrokenPipeError, OSError):
            pass  # the child is gone: its exit status says why, below
        request.clear()   # the module's bytecode (the size of the constants it captured): freed now, not after XLA
        try:
            while True:
                data = _finished_dump(dump_dir)
                if data is not None:
                    log = self._log_so_far()
                    self._ask_to_print(data)
                    return data, log
                if self._child.poll() is not None:
                    data = _finished_dump(dump_dir, writer_done=True)
                    if data is not None:  # the whole compile finished between two looks
                        return data, self._log_so_far()
                    if self._child.returncode == 0:   # XLA compiled, and wrote no dump we know
                        raise Unsupported("this XLA wrote no after-optimizations module with a buffer assignment "
                                          "where the early-stopped compile looks for it")
                    raise CompileFailed(self._failure())
                self._answer_questions()
        finally:
            if not self._printing:
                self.close()

    def _ask_to_print(self, dump: bytes) -> None:
        """Have the child print the module (and cost it) while this process reads the buffer
        assignment: the two halves of reading a compile run on two cores. XLA's backend, still
        running in the child, is given its lowest priority meanwhile (_child_main)."""
        try:
            _send(self._child.stdin, {"print": dump})
            self._printing = True
        except (BrokenPipeError, OSError):
            self._printing = False   # the child is gone: printed() prints here

    def printed(self, dump: bytes) -> tuple[str, dict[str, float]]:
        """The HLO text of `dump` and XLA's cost of its module (:func:`print_module`), from the child
        when :meth:`compile` asked it, else printed here. Stops the child."""
        reply = self._await_print() if self._printing else None
        self._printing = False
        self._kill_and_reap()
        text, cost = reply if reply is not None else print_module(dump)
        return text, cost

    def _await_print(self) -> tuple[str, dict] | None:
        """The child's (text, cost), or None when it failed, died or took too long."""
        stdout = self._child.stdout
        assert stdout is not None  # a pipe (see _spawn)
        deadline = time.monotonic() + _PRINT_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([stdout], [], [], 0.5)
            if ready:
                try:
                    message = _receive(stdout)
                except (EOFError, OSError, pickle.UnpicklingError):
                    return None
                if isinstance(message, dict) and "printed" in message:
                    return message["printed"]
                return None   # its error, or a question XLA should not ask after buffer assignment
            if self._child.poll() is not None:
                return None
        return None

    def _answer_questions(self) -> None:
        """Wait up to one poll interval for a message from the child; answer a partitioning
        callback (jaxmem.compiler.partitioners), raise XLA's error. The child asks one question at
        a time and waits for its answer, so nothing is left unread in the stream's buffer."""
        stdout = self._child.stdout
        assert stdout is not None  # a pipe (see _spawn)
        ready, _, _ = select.select([stdout], [], [], _POLL_S)
        if not ready:
            return
        try:
            message = _receive(stdout)
        except EOFError:   # the child is exiting: its status says why, on the next look
            self._child.wait(timeout=30)
            return
        if "error" in message:
            raise CompileFailed(message["error"])

        try:
            _send(self._child.stdin, partitioners.serve(message, self._answered))
        except (BrokenPipeError, OSError):
            pass

    def _kill_and_reap(self) -> None:
        """Kill the child and reap it on a thread: its teardown (0.15 s after a large compile,
        freeing its memory) is no part of the answer."""
        proc = self._child
        if proc.poll() is None:
            proc.kill()
        self._close_pipes(proc)
        self._close_log()
        self._reaped = True
        threading.Thread(target=proc.wait, name="jaxmem-reap-compile", daemon=True).start()

    def _log_so_far(self) -> str:
        """XLA's log (the child's stderr) up to now."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def _failure(self) -> str:
        try:
            message = _receive(self._child.stdout) if self._child.stdout else None
        except (EOFError, OSError, pickle.UnpicklingError):
            message = None
        if isinstance(message, dict) and "error" in message:
            return message["error"]
        code = self._child.returncode
        self._log.seek(0)
        tail = self._log.read().decode(errors="replace").strip().splitlines()[-3:]
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        hint = " (signal 9 is usually the kernel's out-of-memory killer)" if code == -9 else ""
        return f"the XLA compile process died: {how}{hint}" + (f"; its last lines: {' | '.join(tail)}" if tail else "")

    def close(self) -> None:
        if self._proc is None or self._reaped:
            return
        if self._proc.poll() is None:
            self._proc.kill()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self._close_pipes(self._proc)
        self._close_log()

    def _close_log(self) -> None:
        """Our handle on the child's stderr file (the child writes through its own)."""
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()

    @staticmethod
    def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
        for f in filter(None, (proc.stdin, proc.stdout)):
            try:
                f.close()
            except (OSError, AttributeError):
                pass


def _finished_dump(dump_dir: str, writer_done: bool = False) -> bytes | None:
    """The after-optimizations HloProto once XLA has finished writing it, else None.
    writer_done: the child has exited, so whatever parses to its end is complete. An XLA that
    writes no memory-usage report (jaxlib 0.9) is read as soon as its module parses to its end:
    the buffer assignment is the HloProto's last field, length-prefixed, so no prefix of the file
    being written does."""

    try:
        names = os.listdir(dump_dir)
    except OSError:
        return None
    for n in names:
        if n.endswith("after_optimizations.hlo.pb") and ".jit_" in n:
            # written just after the module, by the same thread: the module file is closed
            if (not writer_done and versions.dumps_memory_usage_report()
                    and n[: -len(".hlo.pb")] + "-memory-usage-report.pb" not in names):
                return None
            with open(os.path.join(dump_dir, n), "rb") as f:
                data = f.read()

            try:
                memory_stats.split_hlo_proto(data)
            except ValueError:
                return None
            return data
    return None


def print_module(dump: bytes, client=None) -> tuple[str, dict[str, float]]:
    """The optimized module of the dump printed as ``compiled.as_text()`` prints it (less the
    module-config attributes of its header line, which the dump does not hold), and XLA's cost
    of it (:func:`jaxmem.compiler.steptime.module_cost`: costed here, not parsed back from the text)."""

    proto, _ = memory_stats.split_hlo_proto(dump)
    module = versions.hlo_module_class().from_serialized_hlo_module_proto(proto)
    return module.to_string(), steptime.module_cost(module, client)


def compile_until_buffer_assignment(child: Child, lowered, options: dict) -> tuple[bytes, str]:
    """(after-optimizations HloProto, XLA's log) of compiling ``lowered`` with ``options`` in
    `child`, which then prints the module: collect it with ``child.printed(dump)``."""

    dump_dir = tempfile.mkdtemp(prefix="jaxmem-")
    try:
        request = capture(lowered, {**dump.compile_options(dump_dir), **options})
        return child.compile(request, dump_dir)
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 -- not Linux: the stdin watch below still ends us
        pass
    if os.environ.get("JAXMEM_COMPILE_PARENT", str(os.getppid())) != str(os.getppid()):
        os._exit(0)   # the parent died before PR_SET_PDEATHSIG took effect


def _child_main(target_config: str, topology: str) -> None:
    _die_with_parent()

    topo = topologies.get_topology_desc(platform="cuda", target_config=target_config, topology=topology)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    try:
        request = _receive(stdin)
    except EOFError:
        os._exit(0)  # the parent answered from its cache, or stopped
    # the parent's answers to partitioning callbacks come on stdin; its closing stdin (or dying)
    # ends us, whatever XLA is doing. Once XLA has dumped the module the parent asks us to print it.
    replies: queue.SimpleQueue = queue.SimpleQueue()
    printing = threading.Event()

    def listen() -> None:
        try:
            while True:
                message = _receive(stdin)
                if isinstance(message, dict) and "print" in message:
                    printing.set()
                    _print_for_parent(message["print"], stdout)
                replies.put(message)
        except (EOFError, OSError):
            os._exit(0)

    threading.Thread(target=listen, daemon=True).start()

    partitioners.forward_to(lambda message: _send(stdout, message), replies)
    # (type: ignore: jaxlib ships its _jax extension without stubs, so mypy cannot see Device's attributes)
    by_id = {d.id: d for d in topo.devices}  # type: ignore[attr-defined]
    try:
        with mlir.make_ir_context():
            module = ir.Module.parse(request["module"])
        topo.devices[0].client.compile(  # type: ignore[attr-defined]
            module, executable_devices=xc.DeviceList(tuple(by_id[i] for i in request["device_ids"])),
            compile_options=xc.CompileOptions.ParseFromString(request["options"]))
    except Exception as e:  # noqa: BLE001 -- any compile failure is sent to the parent, which raises it
        if not printing.is_set():   # after the dump the parent waits for the print, not for XLA
            _send(stdout, {"error": f"{type(e).__name__}: {str(e).strip()[:4000]}"})
            os._exit(1)
    if printing.is_set():
        threading.Event().wait()   # the print ends the process
    os._exit(0)


def _print_for_parent(dump: bytes, stdout) -> None:
    """Print and cost the dumped module for the parent (Child.printed), then end the process.
    XLA's backend is still compiling kernels nobody will use: its threads get the lowest
    priority, so that this one has the core."""
    me = threading.get_native_id()
    try:
        for tid in os.listdir("/proc/self/task"):
            if int(tid) != me:
                os.setpriority(os.PRIO_PROCESS, int(tid), 19)   # Linux: a thread's own nice value
    except (OSError, ValueError, AttributeError):
        pass   # not Linux: the print shares the core
    try:
        reply: dict = {"printed": print_module(dump, xc.make_cpu_client())}
    except Exception as e:  # noqa: BLE001 -- the parent prints it itself
        reply = {"print_failed": f"{type(e).__name__}: {e}"}
    try:
        _send(stdout, reply)
    finally:
        os._exit(0)


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2])
