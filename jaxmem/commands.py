"""The jax side of jaxmem's commands, loaded in one import once the environment is set
(jaxmem.session): what the CLI's commands (jaxmem.cli) and the API's calls (jaxmem.api) call
after their options are checked -- the analysis, the planners, the measurements, the renderers.
Modules, not names, so that a test's monkeypatch of one reaches every caller."""

from jaxmem import pipeline
from jaxmem.compiler import cache
from jaxmem.explore import server as explore
from jaxmem.plan import advise, compare, runner, saved_rows, search
from jaxmem.present import diff as diff_view
from jaxmem.present import (
           notebook,  # (registers how results render in Jupyter)
           render,
           text,
           verify_html,
)
from jaxmem.truth import doctor, verify

__all__ = ["advise", "cache", "compare", "diff_view", "doctor", "explore", "notebook", "pipeline", "render",
           "runner", "saved_rows", "search", "text", "verify", "verify_html"]
