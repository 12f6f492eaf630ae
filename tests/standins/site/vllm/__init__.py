"""Stand-in for vLLM (llmfab tests): the CLI, its argparse behaviour, start-up logs,
failure modes and an OpenAI-compatible server making up tokens. No torch, no GPU."""
from vllm.version import __version__, __version_tuple__  # noqa: F401
