"""What every host module shares (shipped: standard library only, Python 3.9+): errors, state files, release layout, /proc, process identity, stopping, the engine's identity, the start's log."""
