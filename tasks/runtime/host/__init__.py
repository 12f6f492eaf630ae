"""The runtimes' host halves: systemd units and containers (shipped: standard library only, Python 3.9+)."""
