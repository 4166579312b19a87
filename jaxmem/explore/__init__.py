"""`jaxmem explore`: a live what-if page whose every number is the compiler's (docs/explore.md).

  server.py    the HTTP server (stdlib), its routes and lifecycle
  points.py    the explorer's state: points asked for, compiled on compare's worker pool, idle neighbours
  predict.py   predictions from compiled neighbours (a batch move; a sequence move)
  query.py     a request's query string as analyze's options (the CLI's rules and messages)
  controls.py  the controls and the values this model and card accept
  notebook.py  jaxmem.explore() in Jupyter: the page inline, its server a child process
  page/        the page: index.html, explore.js, explore.css (static, shipped in the package)
"""

from __future__ import annotations

import threading
import webbrowser
from collections.abc import Callable

from jaxmem.program.options import AnalyzeOptions


def serve(model: str, opts: AnalyzeOptions, *, port: int = 0, browser: bool = True, jobs: int | None = None,
          executor: str = "local", ray_address: str | None = None, echo: Callable[[str], None] = print) -> None:
    """Serve the explorer of `model` from the point `opts` until interrupted (^C, SIGTERM: the scope of
    jaxmem.scratch raises Interrupted here); then its workers, their compile children and the server stop."""
    from jaxmem.explore import controls, server  # noqa: PLC0415 - the pool (and jax) load with a served explorer
    from jaxmem.explore.points import Explorer  # noqa: PLC0415

    explorer = Explorer(model, opts, jobs=jobs, executor=executor, ray_address=ray_address,
                        seq_arg=controls.seq_arg_of(model))
    try:
        srv = server.make_server(explorer, port)
        try:
            url = server.url_of(srv)
            explorer.ask(opts)   # the starting point compiles while the page loads
            echo(f"jaxmem explore: serving {model} on {url}  (Ctrl-C stops it)")
            if browser:   # in a thread: a browser that takes its time to start must not hold the server
                threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
            srv.serve_forever(poll_interval=0.2)
        finally:
            srv.server_close()
    finally:
        explorer.close()
