"""Compiling for a target: the GPU catalogue and deviceless topologies, lower + compile (cached), the runtime
memory outside XLA's buffers, and the step-time estimate from the compiled program."""
