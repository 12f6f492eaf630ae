"""What is known to break or degrade speculative decoding: the doctor's rules, as data.

Each Rule is a plain record. `when` is the condition: every (fact, wanted) pair must hold,
`wanted` being a value or a tuple of values any of which will do; the facts are computed by
spec_facts.py from the engine version, the drafter's and the target's config.json, the
profile's args and env. `versions` is a range (versions.py) of the engine version; a rule
with a range is "version-based" (evidence "version"). `message` and `fix` are format strings
over the facts. `rank` orders likely causes in the live verdict (lower = more likely to be
why acceptance is low). `ab` is the A/B recipe for rules a comparison settles.

Every fact below was read in vLLM's released wheels (the file and version are in `source`
and in the comments); the ids are part of the interface (`[check] accept`, --json) and never renamed once released.
Standard library only; Python >= 3.9 (this module also runs on the host).
"""
from collections import namedtuple

Rule = namedtuple("Rule", "id engine versions when severity message fix source rank ab")
Rule.__new__.__defaults__ = ("",)  # ab

MODEL_BASED = ("dflash", "eagle", "eagle3", "mtp", "draft_model")

RULES = (
    # vllm/model_executor/models/qwen3_dflash.py and the "dflash" method first ship in 0.20.0
    # (absent from the 0.19.1 wheel); 0.19.x rejects the method in SpeculativeConfig.
    Rule("vllm-dflash-unsupported", "vllm", "<0.20.0", (("method", "dflash"),), "FAIL",
         "method \"dflash\" ({method_key}) on vLLM {version}, which has no DFlash (it came in 0.20.0)",
         "upgrade vLLM to 0.22.0 or later (0.20.x/0.21.x feed the drafter the wrong layers)",
         "vLLM 0.20.0 (vllm/model_executor/models/qwen3_dflash.py added)", 0),
    # V1 runner, gpu_model_runner.py _get_eagle3_aux_layers_from_config: 0.20.0, 0.20.1 and
    # 0.21.0 pass dflash_config.target_layer_ids as they are; 0.22.0 adds 1 (PR #40727).
    Rule("vllm-dflash-layer-offset", "vllm", ">=0.20.0,<0.22.0",
         (("method", "dflash"), ("has_layer_ids", True), ("runner", "v1")), "WARN",
         "vLLM {version} feeds the DFlash drafter target layers {layer_ids} as written in "
         "{draft_config} ({layer_ids_key}); the drafter was trained on the outputs of layers "
         "{layer_ids_shifted} (vLLM numbers hidden states from the embeddings): acceptance "
         "length ~5-16% lower",
         "upgrade vLLM to 0.22.0 or later (or a build with PR #40727)",
         "vllm-project/vllm PR #40727 (in 0.22.0; 0.21.0 still lacks it)", 2,
         "bench the same profile on vLLM 0.21.0 and on 0.22.0 or later: the mean acceptance "
         "length should rise by ~5-16%"),
    # qwen3_dflash.py in 0.20.0 - 0.24.0 never reads layer_types: every drafter layer runs
    # full (and non-causal) attention; 0.25.0 starts reading it.
    Rule("vllm-dflash-swa-ignored", "vllm", ">=0.20.0,<0.25.0",
         (("method", "dflash"), ("sliding", True)), "FAIL",
         "{draft_config}: layer_types has {n_sliding} sliding_attention layer(s) (sliding_window "
         "{sliding_window}), which vLLM {version} ignores: every drafter layer runs full "
         "attention, and acceptance collapses (a Qwen3.6-27B deployment with z-lab's DFlash "
         "drafter on vLLM 0.20.1 measured ~1.1%)",
         "upgrade vLLM to 0.26.0 or later and run it with the V2 model runner "
         "(VLLM_USE_V2_MODEL_RUNNER = \"1\" in [server.env])",
         "vllm-project/vllm issue #40898; qwen3_dflash.py 0.20.0-0.24.0 (layer_types unread)", 1,
         "bench this drafter on vLLM 0.24.x and on 0.26+ with the V2 runner: acceptance "
         "should go from ~1% to the drafter's norm"),
    # 0.25.0 qwen3_dflash.py _resolve_layer_attention: NotImplementedError for mixed layers.
    Rule("vllm-dflash-swa-refused", "vllm", ">=0.25.0,<0.26.0",
         (("method", "dflash"), ("sliding_mixed", True)), "FAIL",
         "{draft_config}: layer_types mixes sliding and full attention, which vLLM {version} "
         "refuses at engine start (NotImplementedError: DFlash does not yet support mixed "
         "sliding/full attention via layer_types)",
         "upgrade vLLM to 0.26.0 or later with the V2 model runner "
         "(VLLM_USE_V2_MODEL_RUNNER = \"1\" in [server.env])",
         "vllm-project/vllm issue #40898; qwen3_dflash.py 0.25.0", 0),
    # 0.26.0 - 0.28.0: NotImplementedError unless use_v2_model_runner, which they force for
    # mixed drafters when VLLM_USE_V2_MODEL_RUNNER is unset; 0.29.0+ reject V1 at config time
    # ("Model Runner V1 does not support: mixed sliding/full dflash drafts").
    Rule("vllm-dflash-swa-needs-v2", "vllm", ">=0.26.0",
         (("method", "dflash"), ("sliding_mixed", True), ("runner", "v1")), "FAIL",
         "{draft_config}: layer_types mixes sliding and full attention, which vLLM {version} "
         "runs on the V2 model runner only, and {runner_why}: the engine will refuse to start",
         "remove VLLM_USE_V2_MODEL_RUNNER = \"0\" from [server.env] (or set it to \"1\")",
         "qwen3_dflash.py 0.26.0 (NotImplementedError); vllm/config/vllm.py 0.29.0 "
         "(_get_v1_model_runner_unsupported_features)", 0),
    # Automatic prefix caching defaults to on (vllm/config/cache.py enable_prefix_caching).
    Rule("vllm-dflash-prefix-caching", "vllm", ">=0.20.0",
         (("method", "dflash"), ("prefix_caching", True)), "WARN",
         "DFlash on vLLM {version} with automatic prefix caching on ({prefix_caching_why}): tokens "
         "restored from the prefix cache never give the drafter context, so acceptance falls as "
         "the hit rate rises",
         "set enable-prefix-caching = false in [server.args] (fab bench both ways to see the cost)",
         "vllm-project/vllm issue #47930 (fix PR #47926, open)", 3,
         "bench with enable-prefix-caching = true, then = false (same prompts, fab bench "
         "--repeat 3 each), and compare: acceptance that recovers with caching off confirms it"),
    # vLLM drafts num_speculative_tokens and ignores block_size; a block holds the anchor too.
    Rule("spec-draft-length", "", "",
         (("method", "dflash"), ("draft_too_long", True)), "WARN",
         "{k_key} = {k} is more than {block_limit}, the most the drafter's block_size = "
         "{block_size} allows ({draft_config})",
         "set {k_key} = {block_limit}",
         "z-lab/dflash README (num_speculative_tokens 15 for block-16 drafters); arXiv 2602.06036", 4,
         "bench k = block_size - 1 (15 for block 16) against a shorter k such as 8, same prompts"),
    Rule("spec-layer-out-of-range", "", "", (("layers_out_of_range", True),), "FAIL",
         "{draft_config}: {layer_ids_key} = {layer_ids} has {bad_layers} outside 0 .. "
         "{last_layer} (the target has {n_layers} layers, {target_config}): this drafter was "
         "made for another model",
         "use the drafter made for this target model",
         "vllm gpu_model_runner.py set_aux_hidden_state_layers (ids index the target's layers)", 0),
    Rule("spec-mask-token", "", "", (("mask_bad", True),), "FAIL",
         "{draft_config}: {mask_why}",
         "use the drafter's published config.json (its mask_token_id must be a token of the "
         "target's vocabulary)",
         "vllm qwen3_dflash.py (mask_token_id from dflash_config); arXiv 2602.06036", 0),
    Rule("spec-drafter-config", "", "", (("drafter_config_bad", True),), "FAIL",
         "{drafter_config_why}",
         "download the drafter again (its config.json) or point {draft_key} at the directory "
         "that holds it",
         "vllm/config/speculative.py (the drafter's config.json is read at engine start)", 0),
)

# What the start-up log shows (spec_evidence.py reads it once the server is ready): these hold whatever
# the version says (a patched or nightly build), and carry evidence "log". The facts are
# `aux_layers` (the tuple the runner logged), `aux_from` ("config" | "model") and the
# drafter's ids, compared in spec_evidence.log_facts.
LOG_RULES = (
    Rule("vllm-dflash-layer-offset", "vllm", "", (("method", "dflash"), ("aux_unshifted", True)),
         "WARN",
         "server.log: `{aux_line}`: the tuple is the drafter's {layer_ids_key} = {layer_ids} "
         "unshifted, so this build (vLLM {version}) lacks the +1 of PR #40727 and feeds the "
         "drafter the outputs of the layers before the ones it was trained on",
         "use vLLM 0.22.0 or later (or a build with PR #40727)",
         "vllm-project/vllm PR #40727", 2),
    Rule("vllm-dflash-aux-layers-ignored", "vllm", "", (("method", "dflash"), ("aux_ignored", True)),
         "WARN",
         "server.log: `{aux_line}`: the runner took the target model's default layers, not the "
         "drafter's {layer_ids_key} = {layer_ids} (expected {layer_ids_shifted})",
         "use a vLLM whose {runner_name} runner reads dflash_config.target_layer_ids (V1 from "
         "0.20.0, V2 from 0.24.0), or switch runner with VLLM_USE_V2_MODEL_RUNNER",
         "vllm v1/worker/gpu/spec_decode/eagle/eagle3_utils.py (reads dflash_config from 0.24.0)", 1),
    Rule("vllm-dflash-aux-layers-mismatch", "vllm", "", (("method", "dflash"), ("aux_mismatch", True)),
         "WARN",
         "server.log: `{aux_line}`: the drafter's {layer_ids_key} = {layer_ids} should give "
         "{layer_ids_shifted}",
         "check that speculative-config.model is the drafter made for this target, and which "
         "config the engine read",
         "vllm-project/vllm PR #40727 (vLLM adds 1 to DFlash's target_layer_ids)", 1),
    # vllm/config/speculative.py (0.19.1 - 0.33.0) warns when an MTP head is run k > 1 times.
    Rule("vllm-mtp-layer-reused", "vllm", "", (("mtp_reused", True),), "INFO",
         "server.log: `{mtp_line}`: the one MTP layer drafts all {k} tokens, so acceptance falls "
         "with the position",
         "compare k = 1 and k = 3 with fab bench --compare; keep the k with the better output tok/s",
         "vllm/config/speculative.py (MTP num_speculative_tokens > 1 warning)", 5,
         "bench num_speculative_tokens = 1 against 3 (same prompts): the faster output tok/s wins"),
)

# Which model runner a vLLM uses when VLLM_USE_V2_MODEL_RUNNER is unset, read in
# vllm/config/vllm.py `use_v2_model_runner` of each wheel: 0.22.0 - 0.28.0 default to V2
# only for a few architectures (none of them Qwen3.6's) and, from 0.26.0, for drafters
# that mix sliding and full attention; 0.29.0 makes V2 the default for all.
RUNNER_DEFAULTS = (
    (">=0.29.0", "v2", "vLLM {version} defaults to the V2 runner"),
    (">=0.26.0", "v1", "vLLM {version} defaults to the V1 runner"),
    ("", "v1", "vLLM {version} defaults to the V1 runner"),
)
FORCES_V2_FOR_MIXED_DFLASH = ">=0.26.0"

# Reference mean acceptance length per method and draft length k (tokens per verification
# step, 1 + accepted/drafts). The live verdict's "low" is below 60% of the reference for k.
Reference = namedtuple("Reference", "method k length source")
REFERENCES = (
    Reference("dflash", 15, 4.1, "vllm-project/vllm PR #40727: Qwen3-8B DFlash on MT-Bench, "
              "4.11-4.16 (HumanEval 6.3); arXiv 2602.06036 Table 1: 4.24-6.54"),
    Reference("eagle3", 3, 2.0, "arXiv 2503.01840 (EAGLE-3): chain drafting 2-3.5"),
    Reference("mtp", 1, 1.8, "Qwen3.6-27B MTP: ~80% acceptance at k = 1"),
    Reference("mtp", 3, 3.3, "Qwen3.6-27B MTP: mean acceptance length ~3.3 at k = 3"),
)
