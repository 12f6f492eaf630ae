"""What the host can tell about a failed server: OOM kills, installed packages (shipped: standard library only, Python 3.9+)."""
