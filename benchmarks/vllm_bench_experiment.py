"""Which difference makes fab bench's TTFT/throughput differ from vllm bench serve's on the real
engine: the prompts (token ids vs vLLM's own random text) or the client? (issue 23, item 6)

    python3 benchmarks/vllm_bench_experiment.py [OUT.json]     # as root, under the real-engine lock

One real server (as benchmarks/vllm_bench_compare.py deploys it); 3 rounds at concurrency 4 of:
fab bench with random token ids, fab bench with vLLM's own RandomDataset prompts as text (dumped
to a --prompts file by vLLM's code), vllm bench serve; then 3 rounds at concurrency 1 (16
requests) of fab bench (ids) and vllm bench serve, alternating. Each with the server's own
TTFT/TPOT means over its window (the histograms of /metrics)."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_bench_compare as C
import realengine
A = type("A", (), dict(input_len=128, output_len=128, num_prompts=64, concurrency=4))
GEN = """
import json, sys
from transformers import AutoTokenizer
from vllm.benchmarks.datasets import RandomDataset
tok = AutoTokenizer.from_pretrained(sys.argv[1])
reqs = RandomDataset(random_seed=0).sample(tok, num_requests=64, input_len=128, output_len=128)
with open(sys.argv[2], "w") as f:
    for r in reqs:
        f.write(json.dumps({"prompt": r.prompt}) + "\\n")
print(sum(r.prompt_len for r in reqs))
"""
def main():
    with tempfile.TemporaryDirectory(prefix="benchcmp-exp-", dir="/var/tmp") as tmp, realengine.real_engine_lock():
        prompts = Path(tmp) / "vllm-random.jsonl"
        r = subprocess.run([str(realengine.VLLM_PYTHON), "-c", GEN, str(realengine.tiny_model("target")), str(prompts)],
                           capture_output=True, text=True)
        print("vLLM random prompts:", r.stdout.strip(), r.stderr[-300:] if r.returncode else "", flush=True)
        profile = Path(tmp) / "profile.toml"
        port = 18172
        profile.write_text(C.profile_text(Path(tmp) / "workdir", port, "none"))
        C.fab("deploy", profile=profile)
        out = []
        try:
            plan = [(n, t, 4) for n in range(3) for t in ("fab-ids", "fab-text", "vllm")]
            plan += [(n, t, 1) for n in range(3, 6) for t in (("fab-ids", "vllm") if n % 2 else ("vllm", "fab-ids"))]
            for n, tool, conc in plan:
                    A.concurrency = conc
                    A.num_prompts = 64 if conc == 4 else 16
                    before = C.server_histograms(port)
                    if tool == "fab-ids":
                        res = C.run_fab(profile, A)
                    elif tool == "fab-text":
                        rr = C.fab("bench", "--json", "--prompts", prompts, "--ignore-eos", "--max-tokens", 128,
                                   "--requests", A.num_prompts, "--concurrency", conc, profile=profile)
                        res = json.loads(rr.stdout.splitlines()[-1])
                    else:
                        res = C.run_vllm(port, A, tmp, n)
                    srv = C.server_window(before, C.server_histograms(port))
                    if tool == "vllm":
                        row = (res["output_throughput"], res["median_ttft_ms"], res["median_tpot_ms"], res["median_itl_ms"])
                    else:
                        row = (res["output_tokens_per_s"], res["ttft_ms"]["p50"], res["tpot_ms"]["p50"], res["itl_ms"]["p50"])
                    out.append({"round": n, "tool": tool, "conc": conc, "row": row, "server": srv, "load": os.getloadavg()[0]})
                    print(n, tool, "c%d" % conc, "tok/s %.1f ttft %.1f tpot %.2f itl %.3f" % row, "server", {k: round(v, 2) for k, v in srv.items()},
                          "load %.1f" % os.getloadavg()[0], flush=True)
        finally:
            C.fab("stop", profile=profile)
        Path(sys.argv[1] if len(sys.argv) > 1 else "experiment.json").write_text(json.dumps(out, indent=1))
main()
