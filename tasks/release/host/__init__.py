"""Release directories on the host (shipped: standard library only, Python 3.9+): allocate, list, launch, relaunch."""
