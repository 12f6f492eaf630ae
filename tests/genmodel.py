"""A generated multi-shard safetensors model for `fab pull` (tests/lab/test_pull_e2e.py,
benchmarks/pull_fanout.py): real safetensors headers, random F16 tensor bytes, an index and a
config.json."""
import json
import os
import struct


def make_model(root, total_mib, shards=4):
    """`shards` safetensors files of `total_mib` MiB in all under `root` (a new directory)."""
    root.mkdir(parents=True)
    per = total_mib * (1 << 20) // shards
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensor = f"model.layers.{i}.mlp.weight"
        header = json.dumps({"__metadata__": {"format": "pt"}, tensor: {
            "dtype": "F16", "shape": [per // 2], "data_offsets": [0, per // 2 * 2]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(root / name, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            left = per // 2 * 2
            while left:
                n = min(left, 8 << 20)
                f.write(os.urandom(n))
                left -= n
        weight_map[tensor] = name
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": per * shards}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                                  "model_type": "qwen3"}))
    return root
