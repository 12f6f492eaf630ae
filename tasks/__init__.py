"""llmfab: deploy LLM inference servers to GPU hosts over SSH from a TOML profile.

The module-level `ns` is the task collection `fab` loads in the checkout (see fabfile.py) and
the installed `llmfab` command bundles (tasks/program.py). Installed, this package is `llmfab`
(setup.cfg), so it never shadows a user's own `tasks`.
"""
from invoke import Collection

from . import cli
from .fleet.executor import exit_2_on_bad_arguments
from .output import quiet_on_closed_pipe

ns = Collection.from_module(cli)
exit_2_on_bad_arguments()
quiet_on_closed_pipe()  # `fab --list | head -1`: no traceback (tasks/output.py)
