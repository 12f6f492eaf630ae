"""`llmfab`: the CLI of `fab` in the checkout, as an installed program that works anywhere.

`fab` finds its tasks by looking for fabfile.py from the current directory up, and reads the
executor from the project's fabric.json; so it only works inside the checkout. `llmfab` is
Fabric's own program class (`Fab`: the -H, -S, -i, -t and --prompt-for-passphrase core
options, SSH config loading, the same config files) given llmfab's task collection and the
fan-out executor directly (Invoke's "bundled namespace" mode), so no file is looked for and
nothing in the user's directory (their tasks.py, fabric.yaml) is loaded or shadowed.

Installed (setup.cfg) as the console script `llmfab = llmfab.program:main`.
"""
from fabric import Config, Executor
from fabric import __version__ as fabric_version
from fabric.main import Fab

from . import ns
from .fleet.executor import FanoutExecutor, exit_2_on_bad_arguments

BINARY = "llmfab"


def _version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("llmfab")
    except PackageNotFoundError:  # imported from a checkout that was never installed
        return "unknown"


class Llmfab(Fab):
    def task_list_opener(self, extra=""):
        # Invoke heads a bundled program's list "Subcommands:"; `llmfab --list` prints the
        # same text as `fab --list` ("Available tasks:"), so either reads the same.
        namespace, self.namespace = self.namespace, None
        try:
            return super().task_list_opener(extra)
        finally:
            self.namespace = namespace

    def print_version(self):
        super().print_version()
        print("Fabric {}".format(fabric_version))

    def execute(self):
        # `fab -H a,b -- CMD` (no task) runs CMD on each host with Fabric's plain executor:
        # fab loads no project config (so no fabric.json executor) for it. Same here.
        if self._remainder_only:
            self.executor_class = Executor
        super().execute()


def make_program():
    program = Llmfab(name=BINARY, binary=BINARY, binary_names=[BINARY], version=_version(),
                     namespace=ns, executor_class=FanoutExecutor, config_class=Config)
    exit_2_on_bad_arguments(program, binary=BINARY)
    return program


def main(argv=None):
    make_program().run(argv)
