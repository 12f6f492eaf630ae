"""What the engine on the host offers to tune (shipped: standard library only, Python 3.9+)."""
