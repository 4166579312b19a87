"""The analysis: a model and options in, one frozen Report out (jaxmem.report).

run.py: the entries (a model file, any model the API takes, a Workload). stages.py: the analysis as
stages, prepare -> trace -> compile -> measure -> report, each a function from one frozen value to
the next. checks.py: the report's warnings, one table of checks in a fixed order. fields.py: the
Report's descriptive fields (target, options, a pipelined step's stages)."""

# The entries are imported from jaxmem.analysis.run (or jaxmem.pipeline, where callers always have):
# a package face importing its own modules would tie every one of them to the others.
