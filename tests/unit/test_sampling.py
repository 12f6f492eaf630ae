"""The sampling rule table (tasks/doctor/sampling.py): `broken`/`low` only from greedy evidence,
the server's default sampling as vLLM derives it, and the verdict through judge()."""
import pytest

from tasks.doctor import findings, sampling
from tasks.profile.serverargs import ServerArgs


def spec(rate, k=3, drafts=400, pos0=None):
    return {"acceptance_rate": rate, "mean_acceptance_length": 1 + rate * k, "drafts": drafts,
            "per_position": [rate if pos0 is None else pos0] + [rate] * (k - 1)}


@pytest.mark.parametrize("window,greedy,probe,want", [
    ("broken", True, "none", "broken"),        # greedy evidence stands
    ("low", True, "none", "low"),
    ("healthy", False, "none", "healthy"),     # healthy under sampling needs no probe
    (None, False, "none", None),
    ("broken", False, "healthy", "sampling"),  # low only under sampling
    ("low", False, "healthy", "sampling"),
    ("broken", False, "broken", "broken"),     # the probe confirms
    ("low", False, "broken", "broken"),
    ("broken", False, None, "unconfirmed"),    # the probe saw too few drafts
    ("broken", False, "none", "unconfirmed"),  # no probe possible (status)
])
def test_rule_table(window, greedy, probe, want):
    assert sampling.rule(window, greedy, probe)[0] == want


def test_every_row_is_reachable():
    seen = set()
    for window in ("broken", "low", "healthy", None):
        for greedy in (True, False):
            for probe in ("none", "healthy", "low", "broken", None):
                seen.add(sampling.rule(window, greedy, probe)[1])
    assert {r[4] for r in sampling.RULES} == seen


class _Server:
    def __init__(self, args, engine="vllm"):
        self.engine, self.flags = engine, ServerArgs.parse(list(args.items()))


class _Profile:
    def __init__(self, args, engine="vllm"):
        self.server = _Server(args, engine)


GEN = {"file": "/m/generation_config.json", "values": {"temperature": 0.6, "top_p": 0.95}}


@pytest.mark.parametrize("args,gen,want,src", [
    ({}, None, 1.0, "vLLM's default"),                       # no file: vLLM's 1.0
    ({}, {"file": "/m/generation_config.json", "values": {}}, 1.0, "vLLM's default"),
    ({}, GEN, 0.6, "/m/generation_config.json"),             # the model's generation_config
    ({"override-generation-config": {"temperature": 0}}, GEN, 0.0,
     "server.args.override-generation-config"),              # the override wins
    ({"override-generation-config": '{"temperature": 0.2}'}, None, 0.2,
     "server.args.override-generation-config"),
])
def test_server_default(args, gen, want, src):
    d = sampling.server_default(_Profile(args), gen)
    assert d == {"temperature": want, "source": "server default", "from": src}


def test_window_sampling_request_over_default():
    default = {"temperature": 1.0, "source": "server default", "from": "vLLM's default"}
    assert sampling.window_sampling({"temperature": 0}, default) == {"temperature": 0.0, "source": "request"}
    assert sampling.window_sampling({"ignore_eos": True}, default) == default
    assert sampling.text(default) == "temperature 1 (server default: vLLM's default)"


INFO = {"method": "draft_model", "k": 3}
SAMPLED = {"temperature": 1.0, "source": "server default", "from": "vLLM's default"}


def test_judge_probes_a_sampled_broken_window_and_names_sampling():
    """The target as its own drafter at temperature 1: 0.13 acceptance; greedy: 1.00."""
    calls = []

    def probe():
        calls.append(1)
        return spec(1.0, drafts=256), 16
    out = {}
    text, more = findings.judge(spec(0.13), out, INFO, [], None, SAMPLED, probe)
    assert calls == [1] and out["verdict"] == "sampling", out
    ev = out["evidence"]
    assert ev["window_verdict"] == "broken" and ev["sampling"] == SAMPLED
    assert ev["greedy_probe"]["verdict"] == "healthy" and ev["greedy_probe"]["requests"] == 16
    assert text.startswith("verdict: sampling (position-0 acceptance 0.13 < 0.3 at temperature 1 "
                           "(server default: vLLM's default), greedy over 16 requests at "
                           "temperature 0, acceptance 1.00: acceptance is low only under sampling")
    assert "wrong drafter" not in text
    assert more == []  # no likely causes: sampling is the cause


def test_judge_random_drafter_broken_either_way():
    out = {}
    findings.judge(spec(0.0), out, INFO, [], None, SAMPLED, lambda: (spec(0.0, drafts=600), 16))
    assert out["verdict"] == "broken" and out["evidence"]["greedy_probe"]["verdict"] == "broken"
    out = {}
    findings.judge(spec(0.0), out, INFO, [], None, {"temperature": 0.0, "source": "request"},
                   lambda: pytest.fail("a greedy window needs no probe"))
    assert out["verdict"] == "broken" and "greedy_probe" not in out["evidence"]


def test_judge_without_a_probe_is_unconfirmed_and_says_how_to_judge():
    out = {}
    text, _ = findings.judge(spec(0.0), out, INFO, [], None, SAMPLED)
    assert out["verdict"] == "unconfirmed" and "`fab bench --temperature 0`" in text
