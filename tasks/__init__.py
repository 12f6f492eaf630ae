"""llmfab: deploy LLM inference servers to GPU hosts over SSH from a TOML profile.

The module-level `ns` is the task collection `fab` loads in the checkout (see fabfile.py) and
the installed `llmfab` command bundles (tasks/program.py). Installed, this package is `llmfab`
(setup.cfg), so it never shadows a user's own `tasks`.
"""
from .interrupts import exit_130_until_a_task_runs

exit_130_until_a_task_runs()  # first: a Ctrl-C during the imports below is 130 too

from invoke import Collection  # noqa: E402

from . import cli  # noqa: E402
from .fleet.executor import exit_2_on_bad_arguments  # noqa: E402
from .output import quiet_on_closed_pipe  # noqa: E402

ns = Collection.from_module(cli)
exit_2_on_bad_arguments(collection=ns)
quiet_on_closed_pipe()  # `fab --list | head -1`: no traceback (tasks/output.py)
