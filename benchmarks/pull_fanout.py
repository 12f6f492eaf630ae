"""`fab pull` fan-out to 8 lab hosts against rsync from this machine (issue 30's bar).

    python benchmarks/run.py pull-fanout [--mib 1024] [--shards 8] [--hosts 8]
                                         [--rate 100mbit] [--disk] [--out F.json]   (as root)

Builds a lab of N namespace hosts (tests/hostlab.py: real sshd each), generates a multi-shard
safetensors model here (tests/genmodel.py) and, side by side in one run, times:
  one-rsync   rsync to one host alone (the copy time of the model)
  one-pull    `fab pull -H h1` (the same, through llmfab)
  seq-rsync   rsync to each host in turn
  par-rsync   rsync to all hosts at once
  pull        `fab pull` to all hosts (the fan-out)
  re-pull     `fab pull` again, nothing changed
Each run but re-pull starts with the hosts' model directories removed. Each host's
/root/models is a tmpfs of its own (the lab's hosts share one disk); `--disk` writes to the
disk instead and times each run until `sync` returns. Bytes sent from this
machine are the tx_bytes of the lab's bridge (what this machine's own stack sent into the
lab; frames between hosts are switched past it), bytes into the hosts the sum of their
veths' counters. `--rate R` (tc tbf) gives this machine's uplink and every host's link in
each direction R, like machines on one switch, so the network, not the CPU, bounds the copy.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from genmodel import make_model  # noqa: E402
from hostlab import HostLab  # noqa: E402

MODEL = "/root/models/gen-model"


def counter(dev, what, netns=None):
    if netns:
        out = subprocess.run(["ip", "netns", "exec", netns, "cat",
                              f"/sys/class/net/{dev}/statistics/{what}"], capture_output=True,
                             text=True, check=True).stdout
        return int(out)
    return int(Path(f"/sys/class/net/{dev}/statistics/{what}").read_text())


def cpu_busy():
    """(busy, total) jiffies of the whole machine (every process, not only ours)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return sum(f) - idle, sum(f)


class Lab:
    def __init__(self, lab, rate):
        self.lab = lab
        self.br = f"lf{lab.slot}br"
        self.veths = {h: lab._hosts[h].veth for h in lab.hosts}
        if rate:
            shape = ["tbf", "rate", rate, "burst", "256kb", "latency", "100ms"]
            for dev in [self.br] + list(self.veths.values()):
                subprocess.run(["tc", "qdisc", "replace", "dev", dev, "root"] + shape, check=True)
            for h in lab.hosts:
                subprocess.run(["ip", "netns", "exec", lab._hosts[h].netns, "tc", "qdisc",
                                "replace", "dev", "eth0", "root"] + shape, check=True)

    def counters(self):
        return {"here": counter(self.br, "tx_bytes"),
                "into_hosts": sum(counter(v, "tx_bytes") for v in self.veths.values())}

    def disks(self, mib):
        """Each host's /root/models its own tmpfs: 8 hosts here share one virtual disk
        (~70 MB/s with fsync), where 8 machines would have a disk each."""
        for h in self.lab.hosts:
            self.lab.exec(h, ["mkdir", "-p", "/root/models"], check=True)
            self.lab.exec(h, ["mount", "-t", "tmpfs", "-o", f"size={mib + 192}m", "tmpfs",
                              "/root/models"], check=True)

    def wipe(self, hosts):
        for h in hosts:
            self.lab.exec(h, ["rm", "-rf", MODEL], check=True)


def rsync(lab, source, host):
    ssh = f"ssh -F {lab.ssh_config}"
    return subprocess.Popen(["rsync", "-a", "--whole-file", "--mkpath", "-e", ssh, f"{source}/",
                             f"{host}:{MODEL}/"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def measure(name, lab, fn, sync):
    before, cpu0, t0 = lab.counters(), cpu_busy(), time.monotonic()
    detail = fn()
    if sync:  # on the disk: until the bytes are on it (the pull fsyncs each file; rsync does not)
        os.sync()
    seconds = time.monotonic() - t0
    after, cpu1 = lab.counters(), cpu_busy()
    row = {"run": name, "seconds": round(seconds, 2),
           "bytes_from_here": after["here"] - before["here"],
           "bytes_into_hosts": after["into_hosts"] - before["into_hosts"],
           "cpu_busy": round((cpu1[0] - cpu0[0]) / max(cpu1[1] - cpu0[1], 1), 2)}
    if detail:
        row.update(detail)
    print(f"{name:10s} {seconds:7.1f} s  from here {row['bytes_from_here'] / 2**20:8.0f} MiB  "
          f"into hosts {row['bytes_into_hosts'] / 2**20:8.0f} MiB  machine CPU busy "
          f"{row['cpu_busy']:.0%}", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run.py pull-fanout", description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="model size in MiB (default 1024)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--rate", default=None, help="tc rate of every link, e.g. 1gbit (default none)")
    ap.add_argument("--disk", action="store_true",
                    help="write to this machine's disk (shared by all hosts) instead of a tmpfs per host")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    with HostLab(args.hosts) as hl:
        lab = Lab(hl, args.rate)
        hosts = hl.hosts
        if not args.disk:
            lab.disks(args.mib)
        source = make_model(Path(hl.root) / "source" / "gen-model", args.mib, args.shards)
        size = sum(p.stat().st_size for p in source.iterdir())
        prof = Path(hl.root) / "pull-bench.toml"
        prof.write_text("\n".join([
            "[target]", f"hosts = {json.dumps(hosts)}", 'name = "pull-bench"',
            "[server]", 'engine = "vllm"', 'python = "/usr/bin/python3"', f'model = "{MODEL}"',
            "[weights]", f'"{MODEL}" = "local:{source}"']) + "\n")
        from tasks.weights.local import list_files
        t0 = time.monotonic()
        list_files("local:" + str(source), str(source))  # the source's sha256, once (cached)
        hashed = time.monotonic() - t0
        print(f"model: {args.shards} shards, {size / 2**20:.0f} MiB; {len(hosts)} hosts; "
              f"link rate {args.rate or 'unshaped (veths)'}; {os.cpu_count()} CPUs; "
              f"load {os.getloadavg()[0]:.2f}; source hashed in {hashed:.1f} s (cached after)",
              flush=True)

        def pull(*sel):
            def run():
                r = hl.fab(*(("-H", ",".join(sel)) if sel else ()), "pull", "--json",
                           profile=prof, timeout=3600)
                if r.returncode != 0:
                    raise SystemExit(f"fab pull exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
                objs = [json.loads(line) for line in r.stdout.splitlines()]
                return {"bytes_received": sum(o["bytes_received"] for o in objs),
                        "from": {o["host"]: o["from"] for o in objs}}
            return run

        def rsyncs(sel, parallel):
            def run():
                procs = []
                for h in sel:
                    procs.append(rsync(hl, source, h))
                    if not parallel:
                        procs[-1].wait()
                for p in procs:
                    out, err = p.communicate()
                    if p.returncode:
                        raise SystemExit(f"rsync exited {p.returncode}: {err.decode()}")
            return run

        rows = []
        for name, fn in (("one-rsync", rsyncs(hosts[:1], False)), ("one-pull", pull(hosts[0])),
                         ("seq-rsync", rsyncs(hosts, False)), ("par-rsync", rsyncs(hosts, True)),
                         ("pull", pull()), ("re-pull", pull())):
            if name != "re-pull":
                lab.wipe(hosts)
            rows.append(measure(name, lab, fn, args.disk))
        t = {r["run"]: r["seconds"] for r in rows}
        summary = {"mib": args.mib, "shards": args.shards, "hosts": len(hosts), "bytes": size,
                   "rate": args.rate, "disk": args.disk, "cpus": os.cpu_count(), "source_hash_seconds": round(hashed, 2),
                   "pull_vs_par_rsync": round(t["pull"] / t["par-rsync"], 2),
                   "pull_vs_one_rsync": round(t["pull"] / t["one-rsync"], 2),
                   "pull_vs_one_pull": round(t["pull"] / t["one-pull"], 2),
                   "pull_vs_seq_rsync": round(t["pull"] / t["seq-rsync"], 2)}
        print(f"\npull / par-rsync {summary['pull_vs_par_rsync']:.2f} (goal <= 0.5), pull / one "
              f"host's rsync {summary['pull_vs_one_rsync']:.2f} (goal <= 2.5), pull / one host's "
              f"pull {summary['pull_vs_one_pull']:.2f}, pull / seq-rsync "
              f"{summary['pull_vs_seq_rsync']:.2f}; re-pull {t['re-pull']:.1f} s")
        if args.out:
            Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
