"""Stand-in for SGLang (llmfab tests): `python -m sglang.launch_server` only."""
__version__ = "0.5.23"
