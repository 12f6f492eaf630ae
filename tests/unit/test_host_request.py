"""The doctor's inputs derived from a profile (tasks/doctor/host_request.py): method, keys, draft
length, runner env, prefix caching, accepted rules; and the [check] table."""
from pathlib import Path

import pytest

from tasks.errors import ProfileError
from tasks.profile.load import load_profile
from tasks.doctor.host_request import doctor_request

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def prof(tmp_path, *lines, base="qwen3.6-27b-dflash.toml"):
    path = tmp_path / "p.toml"
    path.write_text("\n".join([f'extends = "{CONFIGS / base}"'] + list(lines)) + "\n")
    return load_profile(path)


def test_shipped_dflash_profile(tmp_path):
    req = doctor_request(prof(tmp_path))
    assert req["method"] == "dflash" and req["draft"] == "/root/models/Qwen3.6-27B-DFlash"
    assert req["target"] == "/root/models/Qwen3.6-27B" and req["v2_env"] == "1"
    assert req["k"]["value"] == 15 and req["k"]["key"] == "server.args.speculative-config.num_speculative_tokens"
    assert req["prefix_caching"] == {"value": False, "key": "server.args.enable-prefix-caching"}
    assert req["accept"] == [] and req["method_key"] == "server.args.speculative-config.method"


def test_prefix_caching_unset_env_off_and_accept(tmp_path):
    p = prof(tmp_path, "[server.env]", 'VLLM_USE_V2_MODEL_RUNNER = "0"',
             "[check]", 'accept = ["vllm-dflash-swa-needs-v2"]', base="qwen3.6-27b.toml")
    assert doctor_request(p) is None  # no speculative decoding, nothing to judge
    p = prof(tmp_path, "[server.args]",
             'speculative-config = { method = "DFlash", model = "z-lab/Qwen3.6-27B-DFlash", '
             "num_speculative_tokens = 15 }", "[server.env]", 'VLLM_USE_V2_MODEL_RUNNER = "0"',
             "[check]", 'accept = ["vllm-dflash-swa-needs-v2"]', base="qwen3.6-27b.toml")
    req = doctor_request(p)
    assert req["method"] == "dflash" and req["v2_env"] == "0"
    assert req["accept"] == ["vllm-dflash-swa-needs-v2"]
    assert req["prefix_caching"]["value"] is True  # the base profile turns it on


def test_hub_ids_still_get_the_version_rules(tmp_path):
    path = tmp_path / "hub.toml"
    path.write_text('[server]\nengine = "vllm"\nmodel = "Qwen/Qwen3.6-27B"\n[server.args]\n'
                    'speculative-config = { method = "dflash", model = "z-lab/Qwen3.6-27B-DFlash", '
                    "num_speculative_tokens = 15 }\n")
    req = doctor_request(load_profile(path))
    assert req["method"] == "dflash" and req["draft"] is None and req["k"]["value"] == 15
    assert req["prefix_caching"] == {"value": None, "key": None}


def test_unknown_rule_id_in_check_accept_is_bad_input(tmp_path):
    with pytest.raises(ProfileError) as e:
        prof(tmp_path, "[check]", 'accept = ["vllm-dflash-swa-ignord"]')
    assert "check.accept[0]" in str(e.value) and "vllm-dflash-swa-ignored" in str(e.value)
    with pytest.raises(ProfileError):
        prof(tmp_path, "[check]", 'allow = ["x"]')
