"""Compiling for a target: the GPU catalogue and deviceless topologies, lower + compile, the runtime memory outside XLA's buffers."""
