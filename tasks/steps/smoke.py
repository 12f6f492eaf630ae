"""`fab deploy --smoke`: after ready, one 1-token completion must be answered.

Ready (/health 200, the served name in /v1/models) says the server is up; it does not say
the model generates. One completion of one token does, for the cost of one token: the
host's agent sends it to 127.0.0.1:port (nothing needs to be open to the laptop), with
the profile's API key if it has one (tasks/measure/host/loadgen.py, op smoke).
"""
from ..transport.agent import AgentError
from ..errors import OperationFailed

SMOKE_TIMEOUT_S = 120.0  # a cold first request (CUDA graphs, a JIT) can take a while


class SmokeFailed(OperationFailed):
    """The server was ready but did not answer a 1-token completion."""


def smoke_test(host, profile, reporter):
    """Send the completion; return {model, text, completion_tokens, seconds} or raise SmokeFailed."""
    try:
        res = host.call("smoke", host=profile.server.host, port=profile.server.port,
                        model=profile.served_name, models_path=profile.ready.models_path,
                        api_key=profile.api_key, request_timeout=SMOKE_TIMEOUT_S,
                        timeout=SMOKE_TIMEOUT_S + 30)
    except AgentError as e:
        if e.kind != "smoke_failed":
            raise
        raise SmokeFailed(f"smoke test failed: ready, but no completion: {e.message}") from None
    reporter.line(host.name, f"smoke: {res['model']} answered a 1-token completion "
                             f"({res['text']!r}) in {res['seconds']:.2f} s")
    return res


def smoke_after(result, host, profile, reporter):
    """smoke_test after a deploy: its record joins the host's result (and --json object)."""
    res = smoke_test(host, profile, reporter)
    result.data["smoke"] = {"completion_tokens": res["completion_tokens"],
                            "seconds": round(res["seconds"], 3)}
    result.summary += ", answered a 1-token completion"
    return result
