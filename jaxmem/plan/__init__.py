"""Planning over many configurations: comparisons, fit searches, sweeps."""
