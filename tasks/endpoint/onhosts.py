"""What the endpoint's tasks (commands.py) and its member moves (swap.py) run on the endpoint's
hosts: its own summary lines, the hosts and -H, an ordinary task's body, the router's admin
service, and a member's known greedy completion recorded at ready."""
import importlib
import re
import sys

from ..errors import OperationFailed
from ..fleet.fanout import HostResult
from ..output import terminal_lines, write_text

# The raw text of a completion's first choice, extracted exactly as llmfab_park.lua does.
TEXT_RE = re.compile(rb'"text"\s*:\s*"(.*?)"\s*[,}]', re.S)


def say(text):
    """A line of the endpoint's own summary; member ids and answers pass the output layer."""
    write_text(sys.stdout, terminal_lines(text) + "\n")


def hosts_of(c, ep):
    hosts = list(c.config.get("llmfab_hosts") or []) or list(ep.hosts) \
        or list(ep.members[0].profile.target.hosts) or ["local"]
    return list(dict.fromkeys(hosts))


def with_hosts(c, hosts):
    """The Invoke context with -H set to `hosts` (members' tasks then run on the endpoint's hosts)."""
    c.config["llmfab_hosts"] = list(hosts)
    return c


def run_body(module, function, c, opts):
    body = getattr(importlib.import_module(f"..{module}", __package__), function)
    return body(c, opts)


def admin(c, ep, opts, path, method="GET"):
    """{host: {status, body|error}} from the router's admin service on every host."""
    from ..fleet.runner import run_hosts
    from ..output import Reporter
    hosts = hosts_of(c, ep)
    reporter = Reporter(hosts, json_mode=getattr(opts, "json", False))
    answers = {}

    def op(host, rep):
        host.start()
        answers[host.name] = host.call("endpoint_admin", port=ep.admin_port, path=path, method=method)
        return HostResult(host.name)
    run_hosts(c, ep.members[0].profile, op, opts, reporter, hosts=hosts)
    return answers


def record_checks(c, ep, m, opts, *, profile=None, hosts=None):
    """Each host's known greedy completion of member `m` (its slot `profile`), right after its
    ready (the text a wake must give again). {host: raw text}."""
    from ..fleet.runner import run_task
    from .router import check_body
    texts = {}
    prof = profile or m.profile

    def op(host, reporter):
        host.start()
        r = host.call("endpoint_http", host_addr=prof.server.host, port=prof.server.port,
                      path="/v1/completions", method="POST", body=check_body(prof.served_name))
        match = TEXT_RE.search((r.get("text") or "").encode("utf-8", "surrogateescape"))
        if r.get("status") != 200 or not match:
            raise OperationFailed(f"member {m.name}: its check completion answered "
                                  f"{r.get('status') or r.get('error')}: not recorded")
        texts[host.name] = match.group(1).decode("utf-8", "surrogateescape")
        return HostResult(host.name, summary=f"{m.name}: check completion recorded")
    run_task(c, prof, op, opts, title=f"record {m.name}", hosts=hosts or hosts_of(c, ep))
    return texts
