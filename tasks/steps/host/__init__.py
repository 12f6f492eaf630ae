"""Host halves of the steps (shipped: standard library only, Python 3.9+): lock, preflight, stop, wait, logs."""
