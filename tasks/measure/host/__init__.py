"""Load and /metrics from the host itself (shipped: standard library only, Python 3.9+)."""
