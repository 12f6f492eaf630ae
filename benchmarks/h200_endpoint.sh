#!/usr/bin/env bash
# H200 measurements for the endpoint (issue 39). The lead runs it on the H200 over the gpu kit:
#
#   OUT=/tmp/ep-out bash benchmarks/h200_endpoint.sh      # from the repo root, gpu kit at /tmp/gpu-kit
#
# It writes four tiny-model member profiles (vLLM, sleep mode, byte budgets via
# --kv-cache-memory-bytes, gpu-memory-utilization 0.2) and an endpoint profile, then measures
# with real `fab` over `-S /tmp/gpu-kit/ssh_config -H gpu-local`:
#   1. deploy of the endpoint (plan, 4 members, HAProxy router): no OOM start, all answer
#   2. router overhead at concurrency 32 (fab bench through the endpoint port vs a member's port)
#   3. fab sleep of one member, then a request for it: wake to first token (target <= 3 s)
#   4. "rollback to a parked release" stand-in: sleep + wake + answered (target <= 5 s)
#   5. fab stop of one member leaves the others serving; GPU memory per state (nvidia-smi)
# Results: $OUT/h200_endpoint.json and $OUT/h200_endpoint.txt. Runs in well under 8 minutes
# (cold starts of four tiny models dominate). Needs haproxy on the GPU host (apt-get install haproxy).
set -uo pipefail
OUT=${OUT:-/tmp/h200-endpoint-out}; mkdir -p "$OUT"
MODELS=${MODELS:-/var/tmp/vk/models}
KIT=${KIT:-/tmp/gpu-kit/ssh_config}
W=$(mktemp -d /tmp/h200-endpoint-XXXX)
FAB=(python3 -m fabric -S "$KIT" -H gpu-local)
TXT="$OUT/h200_endpoint.txt"; : > "$TXT"
say() { echo "$*" | tee -a "$TXT"; }
names=(); for d in "$MODELS"/*/; do names+=("$(basename "$d")"); done
[ "${#names[@]}" -ge 1 ] || { say "no models under $MODELS"; exit 1; }
members=()
for i in 0 1 2 3; do
  m=${names[$((i % ${#names[@]}))]}; port=$((8301 + i))
  cat > "$W/m$i.toml" <<TOML
[target]
hosts = ["gpu-local"]
name = "ep-m$i"
[server]
engine = "vllm"
python = "/opt/torch/.venv/bin/python3"
model = "$MODELS/$m"
host = "127.0.0.1"
port = $port
[server.args]
served-model-name = "tiny-$i"
enable-sleep-mode = true
gpu-memory-utilization = 0.2
kv-cache-memory-bytes = 2000000000
[server.env]
PYTHONPATH = "/tmp/vllm-site"
VLLM_USE_FLASHINFER_SAMPLER = "0"
HF_HUB_OFFLINE = "1"
VLLM_NO_USAGE_STATS = "1"
VLLM_SERVER_DEV_MODE = "1"
CUDA_VISIBLE_DEVICES = "0"
[ready]
timeout = 240
TOML
  members+=("\"$W/m$i.toml\"")
done
cat > "$W/ep.toml" <<TOML
[endpoint]
name = "h200ep"
port = 8300
admin_port = 8309
members = [$(IFS=,; echo "${members[*]}")]
TOML
now() { python3 -c 'import time;print(time.time())'; }
req() { # model -> seconds to a complete 1-token answer through the endpoint (run on the GPU host)
  "${FAB[@]}" bench --profile "$W/m0.toml" --requests 1 --concurrency 1 --max-tokens 1 >/dev/null 2>&1; }
gpu() { ssh -F "$KIT" gpu-local nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0; }
curl_ep() { ssh -F "$KIT" gpu-local "curl -s -o /dev/null -w '%{http_code} %{time_starttransfer}' -m 60 http://127.0.0.1:8300/v1/completions -H 'content-type: application/json' -d '{\"model\":\"$1\",\"prompt\":\"Hello\",\"max_tokens\":1}'"; }
t0=$(now); "${FAB[@]}" deploy --profile "$W/ep.toml" > "$OUT/deploy.log" 2>&1; rc=$?; t1=$(now)
say "deploy rc=$rc in $(python3 -c "print(round($t1-$t0,1))") s (plan and per-member lines in deploy.log)"
grep -E "GPU 0|peak|awake" "$OUT/deploy.log" | tee -a "$TXT"
say "gpu used after deploy (4 awake): $(gpu) MiB"
for i in 0 1 2 3; do say "tiny-$i via endpoint: $(curl_ep tiny-$i)"; done
# router overhead at concurrency 32: member direct vs through the endpoint (same member)
"${FAB[@]}" bench --profile "$W/m0.toml" --requests 256 --concurrency 32 --max-tokens 64 --json > "$OUT/bench_direct.json" 2>>"$OUT/bench.log"
sed "s/^port = 8301/port = 8300/" "$W/m0.toml" | sed 's/name = "ep-m0"/name = "ep-m0-via"/' > "$W/via.toml"
"${FAB[@]}" bench --profile "$W/via.toml" --requests 256 --concurrency 32 --max-tokens 64 --json > "$OUT/bench_endpoint.json" 2>>"$OUT/bench.log"
say "bench direct:   $(python3 -c "import json;d=json.load(open('$OUT/bench_direct.json'));print({k:d.get(k) for k in ('output_tok_s','ttft_p50_ms','ttft_p99_ms','failed')})" 2>&1)"
say "bench endpoint: $(python3 -c "import json;d=json.load(open('$OUT/bench_endpoint.json'));print({k:d.get(k) for k in ('output_tok_s','ttft_p50_ms','ttft_p99_ms','failed')})" 2>&1)"
# park one member, then wake it by a request
t0=$(now); "${FAB[@]}" sleep --profile "$W/ep.toml" --member ep-m1 >> "$TXT" 2>&1; t1=$(now)
say "sleep ep-m1: $(python3 -c "print(round($t1-$t0,2))") s incl. fab; gpu used with one parked: $(gpu) MiB"
say "request for parked tiny-1 (code, seconds to first byte = wake + answer): $(curl_ep tiny-1)"
say "gpu used after the wake: $(gpu) MiB"
# rollback to a parked release, as far as built: park + wake + answered
"${FAB[@]}" sleep --profile "$W/ep.toml" --member ep-m2 >> "$TXT" 2>&1
t0=$(now); "${FAB[@]}" wake --profile "$W/ep.toml" --member ep-m2 >> "$TXT" 2>&1; r=$(curl_ep tiny-2); t1=$(now)
say "wake (fab) + first answer of parked tiny-2: $r, total $(python3 -c "print(round($t1-$t0,2))") s"
"${FAB[@]}" status --profile "$W/ep.toml" > "$OUT/status.txt" 2>&1
# stop of one leaves the others serving
"${FAB[@]}" stop --profile "$W/m3.toml" >> "$OUT/stop.log" 2>&1
for i in 0 1 2 3; do say "after stop of ep-m3, tiny-$i: $(curl_ep tiny-$i)"; done
"${FAB[@]}" stop --profile "$W/ep.toml" >> "$OUT/stop.log" 2>&1
say "gpu used after stop of the endpoint: $(gpu) MiB"
python3 - "$TXT" "$OUT/h200_endpoint.json" <<'PY'
import json, sys
json.dump({"lines": open(sys.argv[1]).read().splitlines()}, open(sys.argv[2], "w"), indent=1)
PY
