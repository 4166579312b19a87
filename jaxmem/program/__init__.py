"""What is compiled: the model-file contract (workload, presets), the sharding layouts, the training
step and the analytic train state."""
