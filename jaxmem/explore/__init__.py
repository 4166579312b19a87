"""`jaxmem explore`: a live what-if page whose every number is the compiler's (docs/explore.md).

  server.py    the HTTP server (stdlib), its routes and lifecycle (serve: the `jaxmem explore` command)
  points.py    the explorer's state: points asked for, compiled on compare's worker pool, idle neighbours
  predict.py   predictions from compiled neighbours (a batch move; a sequence move)
  query.py     a request's query string as analyze's options (the CLI's rules and messages)
  controls.py  the controls and the values this model and card accept
  notebook.py  jaxmem.explore() in Jupyter: the page inline, its server a child process
  page/        the page: index.html, explore.js, explore.css (static, shipped in the package)
"""

