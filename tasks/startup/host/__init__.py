"""Start-up phases from the engine's own log lines, on the host (shipped: standard library only, Python 3.9+)."""
