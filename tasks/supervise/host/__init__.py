"""The supervisor and its view from the agent (shipped: standard library only, Python 3.9+)."""
