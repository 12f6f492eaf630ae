"""Evidence from the server's start-up log: what the engine really did with the drafter.

vLLM logs the target layers it feeds an EAGLE-3/DFlash drafter, whichever runner it uses:

    V1 (v1/worker/gpu_model_runner.py):  Using auxiliary layers from speculative config: (2, 17, ...)
    V2 (v1/worker/gpu/spec_decode/eagle/eagle3_utils.py):
                                         Using Eagle3 auxiliary layers from config: (...)
                                         Using Eagle3 auxiliary layers from model: (...)

(wording checked in the 0.20.1, 0.21.0, 0.22.0, 0.24.0 and 0.33.0 wheels). The V2 runner
says `Using V2 Model Runner` (v1/worker/gpu_worker.py); a fallback to V1 says `Model Runner
V2 does not yet support %s; using the V1 model runner instead.` (vllm/config/vllm.py).
Compared with the drafter's target_layer_ids: the tuple unshifted means the build lacks
PR #40727, whatever its version says. `op_spec_evidence` takes what the readiness watch's
reader (tasks/base/host/startlog.py) fed its Head of a release's server.log (reading only
what the watch did not), keeps the result as spec-evidence.json in the release directory (so status finds it
later without the log) and returns it.
Standard library only; Python >= 3.9.
"""
import json
import os
import re

from . import spec_check, spec_facts
from ...base.host import startlog
from ...base.host.statefiles import expand, write_json
from .spec_rules import LOG_RULES

AUX = re.compile(r"(Using (?:auxiliary layers from speculative config|Eagle3 auxiliary layers "
                 r"from (config|model))): \(([-\d,\s]*)\)")
V2_IN_USE = "Using V2 Model Runner"
FALLBACK = re.compile(r"Model Runner V2 does not yet support (.*?); using the V1 model runner instead")
# Warnings that a drafter runs other than its config suggests (vllm/config/speculative.py).
MTP_REUSED = re.compile(r"Enabling num_speculative_tokens > 1 will run multiple times of forward "
                        r"on same MTP layer.*")
EVIDENCE_FILE = "spec-evidence.json"
SCAN_BYTES = 32 << 20  # the lines come before "ready"; a huge log's tail is not needed


class Head:
    """What the start-up log showed, line by line (a StartLog consumer,
    tasks/base/host/startlog.py): {aux_layers, aux_from, aux_line, runner, runner_line,
    v1_because, mtp_line} in `seen`. Lines past the first SCAN_BYTES are not looked at."""
    NEEDLES = ("auxiliary layers", V2_IN_USE, "does not yet support", "MTP layer")

    def __init__(self):
        self.seen = {"aux_layers": None, "aux_from": None, "aux_line": None, "runner": None,
                     "runner_line": None, "v1_because": None, "mtp_line": None}
        self.chars = 0

    def feed_lines(self, lines, final=False):
        out = self.seen
        for line in lines:
            if self.chars >= SCAN_BYTES:
                return
            self.chars += len(line) + 1
            if not any(n in line for n in self.NEEDLES):
                continue
            m = AUX.search(line)
            if m and out["aux_layers"] is None:
                out["aux_layers"] = [int(x) for x in m.group(3).replace(" ", "").split(",") if x]
                out["aux_from"] = m.group(2) or "config"
                out["aux_line"] = line[m.start():].strip()
                if out["runner"] is None:
                    out["runner"] = "v2" if m.group(2) else "v1"
            if V2_IN_USE in line:
                out["runner"], out["runner_line"] = "v2", line[line.index(V2_IN_USE):].strip()
            w = MTP_REUSED.search(line)
            if w:
                out["mtp_line"] = w.group(0).strip()
            f = FALLBACK.search(line)
            if f:
                out["runner"], out["v1_because"] = "v1", f.group(1)
                out["runner_line"] = line[f.start():].strip()


def parse(text):
    """{aux_layers, aux_from, aux_line, runner, runner_line, v1_because, mtp_line} from log text."""
    head = Head()
    head.feed_lines(text.splitlines())
    return head.seen


def log_facts(facts, seen):
    """The deployment's facts plus what the log showed, for LOG_RULES."""
    f = dict(facts)
    f.update({k: v for k, v in seen.items() if v is not None})
    aux, ids = seen.get("aux_layers"), facts.get("layer_ids")
    f["mtp_reused"] = bool(seen.get("mtp_line"))
    f["runner_name"] = (seen.get("runner") or facts.get("runner") or "?").upper()
    if aux is not None and ids:
        shifted = [i + 1 for i in ids]
        from_model = seen.get("aux_from") == "model"
        f["aux_ignored"] = from_model and aux != shifted
        f["aux_unshifted"] = not from_model and aux == list(ids)
        f["aux_mismatch"] = not from_model and aux not in (list(ids), shifted)
    return f


def evidence(facts, text, accept=(), seen=None):
    """The log's evidence and its findings, from `text` or from what a Head already `seen`."""
    seen = parse(text) if seen is None else dict(seen)
    f = log_facts(facts, seen)
    found = [spec_check.finding(r, f, "log", accept) for r in LOG_RULES
             if (not r.engine or r.engine == f.get("engine")) and spec_check.holds(f, r.when)]
    return dict(seen, findings=found, layer_ids=facts.get("layer_ids"))


def head_of(log):
    """The Head of `log` (a StartLog), read on to the end of its first SCAN_BYTES."""
    head = log.consumer("spec_evidence", Head)
    log.read_to(None, limit=max(0, SCAN_BYTES - (log.offset - log.start)))
    return head


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")


def generation_config(doctor):
    """{file, values}: the sampling keys of the generation_config.json vLLM reads its default
    sampling from (`--generation-config`: auto = the target's directory, a directory, or
    `vllm` = none), or None when there is none to read."""
    src = doctor.get("generation_config")
    folder = doctor.get("target") if src in (None, "auto") else None if src in ("vllm", "none") else src
    if not isinstance(folder, str):
        return None
    path = os.path.join(expand(folder), "generation_config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return {"file": path, "values": None}
    if not isinstance(cfg, dict):
        return {"file": path, "values": None}
    return {"file": path, "values": {k: cfg[k] for k in SAMPLING_KEYS if k in cfg}}


def op_spec_evidence(deploy_dir, release=None, doctor=None, scan=False, log_offset=None):
    """The doctor's view of a release, in one request: the version and config findings
    (spec_check.summary, over the facts the preflight kept in the release: spec_facts.kept)
    and the start-up log's evidence: scanned now and stored (`scan`: true, deploy at ready),
    else read from spec-evidence.json (status, bench)."""
    rdir = os.path.join(expand(deploy_dir), "releases", release) if release else None
    facts, out = spec_check.summary(doctor, spec_facts.kept(rdir) if rdir else None)
    out["evidence"] = None
    out["generation_config"] = generation_config(doctor or {})
    if not facts or rdir is None:
        return out
    path = os.path.join(rdir, EVIDENCE_FILE)
    if not scan:
        try:
            with open(path) as f:
                out["evidence"] = json.load(f)
            return out
        except (OSError, ValueError):
            pass  # never scanned (deployed with --no-wait, or by an older llmfab): scan now
    head = head_of(startlog.of(os.path.join(rdir, "server.log"), log_offset))
    ev = evidence(facts, "", (doctor or {}).get("accept") or (), seen=head.seen)
    if ev["aux_layers"] is not None or ev["runner"] is not None or ev["mtp_line"]:
        write_json(path, ev)
    out["evidence"] = ev
    return out

