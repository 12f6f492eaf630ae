#!/bin/bash
# One chunk of the GPU session on the H200 machine (issue 29), from the project's root there:
#     bash tests/gpu/session.sh setup|A|B|C|D BUDGET_S
# after the gpu kit (sshd-up.sh, PYTHONPATH=/tmp/site) and vllm-kit's `install` (vLLM in
# /tmp/vllm-site, models in /var/tmp/vk/models). Every chunk stops its steps BUDGET_S seconds
# after it began and leaves one tarball in $OUT: what fab printed, the figures, the recordings,
# the release directories of the host (server.log, startup.json, argv.json), pytest's output.
#   setup  the interpreters a user would make: /tmp/vpy (a venv over the device's torch with
#          vLLM's tree on a .pth) and /tmp/vpy-notorch (vLLM visible, torch not)
#   A      recorded failures (parallel group, beside the engine-check test), then the ones
#          with a memory hog (alone), then the defect tests that start servers
#   B      the lifecycle suite (cold/warm compile, status, bench, rollback, stop, supervision,
#          verdicts)
#   C      fab tune over six variants, fab bench against vllm bench serve, the torch stand-in suite
#   D      several deployments on GPU 0 (issue 36): stop one, an orphan, kill-gpu-procs, a hang
set -uo pipefail
CHUNK=$1; BUDGET=${2:-540}
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
TORCH=/opt/torch/.venv/bin/python3
M=/var/tmp/vk/models
W=/var/tmp/gpuwork-out/$CHUNK
mkdir -p "$W"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export LLMFAB_GPU_HOST=gpu-local LLMFAB_GPU_SSH_CONFIG=/tmp/gpu-kit/ssh_config
export LLMFAB_GPU_VLLM_PYTHON=/tmp/vpy/bin/python3 LLMFAB_GPU_TORCH_PYTHON=$TORCH
export LLMFAB_GPU_VLLM_SITE=/tmp/vllm-site LLMFAB_GPU_NOTORCH_PYTHON=/tmp/vpy-notorch/bin/python3
export LLMFAB_GPU_MODEL=$M/target LLMFAB_GPU_DRAFTER=$M/drafter LLMFAB_GPU_OUT=$W/suite
export LLMFAB_GPU_WORKDIR=/var/tmp/llmfab-gpu
PYTEST=(python3 -m pytest -p no:cacheprovider -o addopts= -v -rA --timeout 600)

step() {  # step NAME SECONDS CMD...: run CMD with a time limit (never past the chunk's budget)
  local name=$1 want=$2; shift 2
  local l; l=$(( $(left) - 20 )); [ "$want" -lt "$l" ] || want=$l
  if [ "$want" -lt 15 ]; then echo "=== SKIP $name: $(left) s left"; echo "$name skipped" >> "$W/skipped"; return 0; fi
  echo "=== $name (limit $want s) at $(date -u +%H:%M:%S)"
  local t=$(date +%s.%N)
  timeout -k 5 "$want" "$@" > "$W/$name.out" 2>&1; local rc=$?
  echo "=== $name rc=$rc in $(python3 -c "import time; print(round(time.time()-$t,1))") s"
  tail -n 40 "$W/$name.out"
  echo "$name rc=$rc" >> "$W/rcs"
}

pack() {
  nvidia-smi > "$W/nvidia-smi.end.txt" 2>&1
  ps -eo pid,ppid,etimes,args > "$W/ps.end.txt"
  tar --exclude='*/cache/*' -czf "$W/host-workdir.tgz" -C / var/tmp/llmfab-gpu 2>/dev/null
  tar -czf "$OUT/gpu-$CHUNK.tgz" -C /var/tmp/gpuwork-out "$CHUNK"
  ls -la "$OUT"
}

case $CHUNK in
setup)
  "$TORCH" -m venv --without-pip /tmp/vpy
  printf '%s\n' /tmp/vllm-site /opt/torch/.venv/lib/python3.12/site-packages > /tmp/vpy/lib/python3.12/site-packages/vllm-site.pth
  python3 -m venv --without-pip /tmp/vpy-notorch
  echo /tmp/vllm-site > /tmp/vpy-notorch/lib/python3.12/site-packages/vllm-site.pth
  /tmp/vpy/bin/python3 -c 'import torch, vllm, importlib.metadata as m; print("vpy:", m.version("vllm"), torch.__version__, torch.cuda.is_available())'
  /tmp/vpy-notorch/bin/python3 -c 'import importlib.metadata as m; print("vpy-notorch sees vllm", m.version("vllm"))'
  /tmp/vpy-notorch/bin/python3 -c 'import torch' 2>&1 | tail -1
  python3 -c 'import fabric, pytest, aiohttp; print("controller: fabric", fabric.__version__, "pytest", pytest.__version__)'
  ls $M; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
  ;;
A)
  REC=(python3 tests/fixtures/failures/gpu-h200/record.py --python "$TORCH" --site /tmp/vllm-site
       --model "$M/target" --out "$W/failures")
  step failures-parallel 200 "${REC[@]}" parallel &
  step suite-check 200 "${PYTEST[@]}" tests/gpu/test_gpu_vllm_defects.py -k check
  wait
  step failures-hog 240 "${REC[@]}" hog
  step suite-defects 300 "${PYTEST[@]}" tests/gpu/test_gpu_vllm_defects.py -k "not check"
  pack ;;
B)
  step suite-life 560 "${PYTEST[@]}" tests/gpu/test_gpu_vllm_life.py
  pack ;;
C)
  P=$W/profiles; mkdir -p "$P"
  python3 - "$P" <<'EOF'
import sys
sys.path.insert(0, "tests/gpu")
import gpuvllm as g
d = sys.argv[1]
eager = {"enforce-eager": True}
g.profile(f"{d}/gpu-tune.toml", "gpu-tune", 18340, args=dict(eager, **{"speculative-config": {
    "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}}))
g.profile(f"{d}/self-drafter.toml", "gpu-tune", 18340, args=dict(eager, **{"speculative-config": {
    "method": "draft_model", "model": g.MODEL, "num_speculative_tokens": 3}}))
g.profile(f"{d}/random-drafter.toml", "gpu-tune", 18340, args=dict(eager, **{"speculative-config": {
    "method": "draft_model", "model": g.DRAFTER, "num_speculative_tokens": 3}}))
EOF
  step tune 380 python3 -m fabric -S /tmp/gpu-kit/ssh_config tune --profile "$P/gpu-tune.toml" \
      --vary server.args.speculative-config.num_speculative_tokens=1,2,4 --baseline \
      --profiles "$P/self-drafter.toml,$P/random-drafter.toml" --concurrency 4 --requests 16 \
      --max-tokens 64 --repeat 1 --out "$W/tune"
  step bench-compare 200 python3 benchmarks/run.py vllm-compare --python /tmp/vpy/bin/python3 \
      --model "$M/target" --arg max-model-len=1024 --arg gpu-memory-utilization=0.3 --arg enforce-eager=true \
      --env VLLM_USE_FLASHINFER_SAMPLER=0 --env HF_HUB_OFFLINE=1 --env VLLM_NO_USAGE_STATS=1 \
      --repeats 3 --num-prompts 64 --concurrency 4 --port 18350 --out "$W/bench-compare.json"
  export LLMFAB_GPU_PYTHON=$TORCH; step suite-torch-standin 120 "${PYTEST[@]}" tests/gpu/test_gpu_real.py
  pack ;;
D)
  step suite-shared 540 "${PYTEST[@]}" tests/gpu/test_gpu_shared_box.py
  pack ;;
esac
echo "chunk $CHUNK done in $(( $(date +%s) - T0 )) s"
