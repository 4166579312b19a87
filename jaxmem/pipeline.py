"""The analysis' public entries, where callers have always imported them from. The analysis itself
is the package jaxmem.analysis (stages, checks, fields); AnalyzeOptions lives in jaxmem.program.options."""

from __future__ import annotations

from jaxmem.analysis.run import analyze_file, analyze_model, analyze_workload, remat_block
from jaxmem.analysis.stages import OFFLOAD_ON_CPU
from jaxmem.compiler.targets import CPU_FUSIONS_OFF
from jaxmem.program.options import AnalyzeOptions, command_line, offloads_activations

__all__ = ["CPU_FUSIONS_OFF", "OFFLOAD_ON_CPU", "AnalyzeOptions", "analyze_file", "analyze_model", "analyze_workload",
           "command_line", "offloads_activations", "remat_block"]
