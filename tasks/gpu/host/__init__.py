"""GPU facts and GPU holders on the host (shipped: standard library only, Python 3.9+)."""
