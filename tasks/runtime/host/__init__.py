"""The runtimes' host halves (shipped: standard library only, Python 3.9+)."""
