"""One Ray node on the host (shipped: standard library only, Python 3.9+)."""
