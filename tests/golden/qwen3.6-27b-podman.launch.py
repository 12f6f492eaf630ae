#!/usr/bin/env python3
"""llmfab launcher: deployment 'qwen36-podman', profile qwen3.6-27b-podman.toml (sha256 <digest>).

Rerun by hand from anywhere:  <python> {this file}
It starts the server detached (own session and process group), appends its output
to server.log beside this file, records ../../server.json, and returns at once.
Standard library only; Python >= 3.9.
"""
import json
import os
import signal
import subprocess
import sys
import time

# The server's argv, exactly as the server receives it. No shell is involved.
ARGV = [
    'python3',
    '-m',
    'vllm.entrypoints.cli.main',
    'serve',
    '/root/models/Qwen3.6-27B',
    '--tensor-parallel-size',
    '2',
    '--max-model-len',
    '65536',
    '--gpu-memory-utilization',
    '0.92',
    '--no-enable-prefix-caching',
    '--served-model-name',
    'qwen3.6-27b',
    '--speculative-config',
    '{"method":"dflash","model":"/root/models/Qwen3.6-27B-DFlash","num_speculative_tokens":15}',
    '--host',
    '0.0.0.0',
    '--port',
    '30000',
]

# Added to the host's environment. Secrets live in secrets.json (mode 0600) beside
# this file and are merged in at launch; their values never appear here.
ENV = {
    'CUDA_VISIBLE_DEVICES': '0,1',
    'VLLM_USE_V2_MODEL_RUNNER': '1',
    'HF_HOME': '/root/.cache/huggingface',
}
SECRET_NAMES = []

# The engine's cache directory (compiled graphs), relative to the deployment directory:
# one per engine version, shared by every release and restart of this deployment, so a
# redeploy starts warm. Empty when the profile sets it itself or the engine has none.
CACHE_ENV = {
    'VLLM_CACHE_ROOT': 'cache/vllm-unknown',
}

PORT = 30000


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


def _write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.write("\n")
    os.replace(tmp, path)


def _environment(here):
    env = dict(os.environ)
    env.update(ENV)
    # Inherited by every child, even one that leaves the process group: `fab stop`
    # finds this deployment's stragglers by it.
    env["LLMFAB_RELEASE"] = here
    deployment = os.path.dirname(os.path.dirname(here))
    for name, rel in CACHE_ENV.items():
        env[name] = os.path.join(deployment, rel)
        os.makedirs(env[name], exist_ok=True)
    if SECRET_NAMES:
        with open(os.path.join(here, "secrets.json")) as f:
            secrets = json.load(f)
        env.update({k: secrets[k] for k in SECRET_NAMES})
    return env


# The container this release runs in: engine, image, GPUs, mounts, restart policy ([supervise]).
CONTAINER = {
    'engine': 'podman',
    'name': 'llmfab-qwen36-podman',
    'image': 'docker.io/vllm/vllm-openai:v0.26.0',
    'gpus': 'cdi',
    'devices': [0, 1],
    'mounts': [['/root/models/Qwen3.6-27B', '/root/models/Qwen3.6-27B', True], ['/root/models/Qwen3.6-27B-DFlash', '/root/models/Qwen3.6-27B-DFlash', True], ['/root/.cache/huggingface', '/root/.cache/huggingface', False]],
    'engine_args': ['--shm-size=16g'],
    'restart': 'on-failure:5',
    'grace': 30.0,
    'port': 30000,
}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    deployment = os.path.dirname(os.path.dirname(here))
    # Only what the profile gives: the host's own environment stays outside the container.
    env = dict(ENV, LLMFAB_RELEASE=here)
    for name, rel in CACHE_ENV.items():
        env[name] = os.path.join(deployment, rel)
        os.makedirs(env[name], exist_ok=True)
    if SECRET_NAMES:
        with open(os.path.join(here, "secrets.json")) as f:
            secrets = json.load(f)
        env.update({k: secrets[k] for k in SECRET_NAMES})
    sys.path.insert(0, here)
    from llmfab_host.runtime.host import container
    record = container.launch(here, ARGV, env, CONTAINER)
    if "error" not in record:
        _write_json(os.path.join(deployment, "server.json"), record)
    print(json.dumps(record))
    return 1 if "error" in record else 0


if __name__ == "__main__":
    sys.exit(main())
