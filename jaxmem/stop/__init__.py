"""How jaxmem stops when asked to: SIGINT, SIGTERM and SIGHUP during a command (jax-free, every module).

The main thread gets :class:`jaxmem.stop.state.Interrupted` (a KeyboardInterrupt) and unwinds through
every ``finally`` (a measuring child process is killed on the way), then exits 128 + the signal. A
signal is never lost:

* Python runs the handler at its next bytecode; when that is inside a callback whose exceptions
  Python ignores (jax's garbage-collection callback ``_xla_gc_callback``, a ``__del__``, a
  weakref callback), the Interrupted is reported to ``sys.unraisablehook``: the scope's hook
  keeps it quiet (no "Exception ignored in ..." traceback) and raises it again in the main
  thread as soon as that callback has returned (:mod:`.hooks`, :mod:`.reraise`).
* A signal that was recorded but never unwound the scope (swallowed by a bare ``except:`` in
  code jaxmem called) is raised when the scope ends, so the command ends 128 + the signal, never
  with a verdict.
* A C++ compile holds the GIL and does not return to Python until it is done, so no thread of
  ours can act then: a small helper process (:mod:`.helper`), woken by the signal itself
  (``signal.set_wakeup_fd`` writes to its pipe from the C-level handler), removes the scratch
  directory and ends jaxmem with SIGKILL (exit 137) if it has not unwound within GRACE_S (seconds
  of an idle machine, times the load per core: on a loaded 2-core machine an XLA:CPU compile took
  over 2 s to reach its next signal check, and a fixed 2 s killed it), saying which signal and what
  jaxmem was doing (:func:`jaxmem.stop.progress.phase`). The same helper removes the directory when
  jaxmem dies without unwinding at all (SIGKILL, a segfault inside XLA).

Modules: ``state`` (the signal received, what was being done), ``signals`` (the handler),
``reraise`` (raising again in the main thread), ``hooks`` (sys.unraisablehook / excepthook / a log
filter that keep an interrupt quiet), ``helper`` (the process that acts when Python cannot),
``progress`` (the label of what jaxmem is doing). :func:`jaxmem.scratch.run_scope` puts them together.
"""
