"""Reading XLA's answer: the buffer assignment it dumps, decoded and attributed to modules and categories."""
