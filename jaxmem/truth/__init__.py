"""Ground truth: measuring a real step on this machine, calibration, and the analytic baselines jaxmem
is compared with."""
