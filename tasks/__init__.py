"""llmfab: deploy LLM inference servers to GPU hosts over SSH from a TOML profile.

The module-level `ns` is the task collection `fab` loads (see fabfile.py).
"""
from invoke import Collection

from . import cli
from .executor import exit_2_on_bad_arguments

ns = Collection.from_module(cli)
exit_2_on_bad_arguments()
