"""The stand-in vLLM's speculative decoding, as each real version behaves (installed as
`llmfab_standin.specversions`; the version is the stand-in package's own, set by
build_ml_env(..., vllm_version=...)).

Read in the released wheels (file and version beside each copied text):
  - "dflash" is a method from 0.20.0; 0.19.x's SpeculativeConfig.method is a pydantic
    Literal without it (vllm/config/speculative.py 0.19.1).
  - V1 runner (v1/worker/gpu_model_runner.py) logs `Using auxiliary layers from speculative
    config: %s`, with dflash_config.target_layer_ids as written before 0.22.0 and + 1 from
    0.22.0 (PR #40727). V2 (v1/worker/gpu/spec_decode/eagle/eagle3_utils.py) logs `Using
    Eagle3 auxiliary layers from config: %s`, reading dflash_config (+ 1) from 0.24.0; before
    that it logs `... from model: %s` with the target's defaults. v1/worker/gpu_worker.py logs
    `Using V2 Model Runner`.
  - Which runner (vllm/config/vllm.py use_v2_model_runner): VLLM_USE_V2_MODEL_RUNNER wins;
    else 0.26.0 - 0.28.0 pick V2 for drafters mixing sliding and full attention, 0.29.0+ V2.
  - layer_types (model_executor/models/qwen3_dflash.py): unread in 0.20.0 - 0.24.0 (every
    layer full attention: acceptance collapses, STANDIN_BROKEN_ACCEPT); 0.25.0 raises
    NotImplementedError for mixed layers; 0.26.0 - 0.28.0 raise another one on the V1
    runner; 0.29.0+ refuse V1 at config time (ValueError, vllm/config/vllm.py).
  - The unshifted layers cost ~15% acceptance length (PR #40727's measurements).
  - DFlash with prefix caching (on unless --no-enable-prefix-caching, vllm/config/cache.py):
    acceptance falls with the hit rate (issue #47930): STANDIN_PREFIX_HIT_RATE of the prompt
    tokens hit the cache (0: a workload without shared prefixes, unless a test says
    otherwise), and acceptance is scaled by 1 - hit rate.
"""
import json
import os

import vllm

V1_AUX = "Using auxiliary layers from speculative config: %s"
V2_AUX = "Using Eagle3 auxiliary layers from %s: %s"
V2_IN_USE = "Using V2 Model Runner"
REFUSED_025 = ("NotImplementedError: DFlash does not yet support mixed sliding/full attention via "
               "layer_types; see https://github.com/vllm-project/vllm/issues/40898.")
NEEDS_V2_026 = ("NotImplementedError: DFlash drafters with mixed sliding/full attention require the "
                "V2 model runner; relaunch with VLLM_USE_V2_MODEL_RUNNER=1.")
NEEDS_V2_029 = "ValueError: Model Runner V1 does not support: mixed sliding/full dflash drafts"
METHODS_019 = ("'ngram', 'medusa', 'mlp_speculator', 'draft_model', 'suffix', 'eagle', 'eagle3', "
               "'extract_hidden_states', 'deepseek_mtp', 'mimo_mtp', 'glm4_moe_mtp', "
               "'glm4_moe_lite_mtp', 'glm_ocr_mtp', 'ernie_mtp', 'nemotron_h_mtp', 'exaone_moe_mtp', "
               "'qwen3_next_mtp', 'qwen3_5_mtp', 'longcat_flash_mtp', 'mtp', 'pangu_ultra_moe_mtp', "
               "'step3p5_mtp' or 'ngram_gpu'")


def version():
    return tuple(int(x) for x in vllm.__version__.split("+")[0].split(".")[:3])


def unknown_method_error(method):
    """0.19.x has no "dflash": the pydantic Literal error of SpeculativeConfig, or None."""
    if method == "dflash" and version() < (0, 20, 0):
        return ("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                "SpeculativeConfig\nmethod\n  Input should be %s [type=literal_error, "
                "input_value='dflash', input_type=str]" % METHODS_019)
    return None


class Drafter:
    """What the stand-in reads of the speculative config and the drafter's config.json."""

    def __init__(self, spec):
        self.method = spec.get("method")
        self.config = {}
        try:
            with open(os.path.join(spec.get("model") or "", "config.json")) as f:
                self.config = json.load(f)
        except (OSError, ValueError):
            pass
        types = self.config.get("layer_types") or []
        n = sum(t == "sliding_attention" for t in types)
        self.sliding, self.mixed = n > 0, 0 < n < len(types)
        dc = self.config.get("dflash_config") or {}
        self.layer_ids = dc.get("target_layer_ids") or self.config.get("target_layer_ids")

    def runner(self):
        env = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
        if env is not None:  # vLLM's bool(int(value)) (vllm/envs.py): "true" stops it with ValueError
            return "v2" if int(env) else "v1"
        v = version()
        if self.method == "dflash" and self.mixed and v >= (0, 26, 0):
            return "v2"
        return "v2" if v >= (0, 29, 0) else "v1"

    def refusal(self):
        """(where, text) of the error this version stops at, or None."""
        if self.method != "dflash" or not self.mixed:
            return None
        v = version()
        if (0, 25, 0) <= v < (0, 26, 0):
            return "engine", REFUSED_025
        if v >= (0, 26, 0) and self.runner() == "v1":
            return ("config", NEEDS_V2_029) if v >= (0, 29, 0) else ("engine", NEEDS_V2_026)
        return None

    def shifted(self):
        """Whether this version's runner adds 1 to DFlash's target_layer_ids."""
        return version() >= ((0, 22, 0) if self.runner() == "v1" else (0, 24, 0))

    def log_lines(self):
        """The start-up lines (message, where) about the runner and the aux layers."""
        out = []
        if self.runner() == "v2":
            out.append((V2_IN_USE, "gpu_worker.py:272"))
        if self.method not in ("dflash", "eagle3") or not self.layer_ids:
            return out
        ids = [i + 1 for i in self.layer_ids] if self.shifted() else list(self.layer_ids)
        if self.runner() == "v1":
            out.append((V1_AUX % (tuple(ids),), "gpu_model_runner.py:4840"))
        elif version() >= (0, 24, 0):
            out.append((V2_AUX % ("config", tuple(ids)), "eagle3_utils.py:28"))
        else:
            out.append((V2_AUX % ("model", (2, 32, 61)), "eagle3_utils.py:31"))
        return out

    def accept_rate(self, base, prefix_caching):
        """The acceptance this version would show for a drafter whose norm is `base`."""
        if self.method != "dflash":
            return base
        if self.sliding and version() < (0, 25, 0):
            return float(os.environ.get("STANDIN_BROKEN_ACCEPT", "0.011"))
        rate = base
        if self.layer_ids and not self.shifted():
            rate *= 0.85
        if prefix_caching:
            rate *= 1.0 - prefix_hit_rate()
        return rate


def prefix_hit_rate():
    return float(os.environ.get("STANDIN_PREFIX_HIT_RATE", "0"))


def add_prefix_counters(metrics, prefix_caching):
    """vLLM's prefix-cache counters (v1/metrics/loggers.py) on a stand-in Metrics: queries are
    the prompt tokens, hits STANDIN_PREFIX_HIT_RATE of them (none with caching off)."""
    render = metrics.render
    rate = prefix_hit_rate() if prefix_caching else 0.0

    def with_prefix():
        text = render()
        q = metrics.prompt_tokens
        labels = '{engine="0",model_name="%s"}' % metrics.model_name
        for name, doc, value in (("queries", "Prefix cache queries, in terms of number of queried tokens.", q),
                                 ("hits", "Prefix cache hits, in terms of number of cached tokens.",
                                  int(q * rate))):
            text += ("# HELP vllm:prefix_cache_%s_total %s\n# TYPE vllm:prefix_cache_%s_total counter\n"
                     "vllm:prefix_cache_%s_total%s %s.0\n" % (name, doc, name, name, labels, value))
        return text
    metrics.render = with_prefix
