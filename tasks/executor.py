"""Fabric executor that hands `-H` hosts to llmfab's own fan-out instead of looping.

Fabric's executor calls a task once per `-H` host, one after the other, with a
Connection. llmfab tasks need every host at once (bounded parallelism, one summary
table, the worst exit code), so this executor calls each task once with a plain
Context and leaves the host list in the config (`llmfab_hosts`). It is selected by
the project's `fabric.json` (`tasks.executor_class`).
"""
from fabric.executor import Executor
from invoke.executor import Executor as InvokeExecutor


class FanoutExecutor(Executor):
    def expand_calls(self, calls, apply_hosts=True):
        host_str = self.core[0].args.hosts.value if apply_hosts else None
        hosts = [h.strip() for h in host_str.split(",") if h.strip()] if host_str else []
        self.config["llmfab_hosts"] = hosts
        return InvokeExecutor.expand_calls(self, calls)
