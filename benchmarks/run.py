"""llmfab's benchmarks, one command: `python benchmarks/run.py NAME [OPTIONS]` (`NAME --help` for each).

Every benchmark is a module of benchmarks/ with `main(argv)`, standing on benchmarks/harness.py
(lab hosts, side-by-side runs, repeats, medians, tables). One entry point by path rather than
`python -m benchmarks`: benchmarks/ is not a package (nothing installs it), it runs from a
checkout as root, and the commands benchmarks/RESULTS.md quotes keep one form.
"""
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# name -> (module in benchmarks/, what it measures; RESULTS.md's sections cite these names)
BENCHMARKS = {
    "guard": ("guard", "the speed guard: deploy --no-wait vs a minimal Fabric script, 1 and 8 hosts"),
    "suite": ("suite", "the launch suite of issues 8/16: ssh, Fabric, Ansible, pyinfra, latency, CPU"),
    "startup": ("startup", "cold start vs warm redeploy of the real vLLM, phase by phase"),
    "restart": ("restart", "supervised restarts: kill -9 of the server -> new server ready"),
    "tune-hosts": ("tune_hosts", "fab tune over 1 host against the same sweep over 3"),
    "tune-slots": ("tune_slots", "fab tune --slots auto on 8 fake GPUs against --slots 1"),
    "pull-fanout": ("pull_fanout", "fab pull to 8 hosts against rsync from here, in turn and at once"),
    "pull-small": ("pull_small", "fab pull of 5,000 small files against scp -r, one host"),
    "vllm-compare": ("vllm_bench_compare", "fab bench against vllm bench serve on one real server"),
    "runtimes": ("runtimes", "runtime systemd against process on one host: deploy-to-ready, stop"),
    "bench-clients": ("bench_clients", "fab bench's client against vllm bench serve's, engine taken out"),
    "endpoint-routers": ("endpoint_routers", "HAProxy, nginx+lua, vllm-router, LiteLLM in front of two servers vs direct"),
}


def usage():
    width = max(map(len, BENCHMARKS))
    return "usage: python benchmarks/run.py NAME [OPTIONS]   (NAME --help for its options)\n\n" + "\n".join(
        "  %-*s  %s" % (width, name, what) for name, (_, what) in BENCHMARKS.items())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] not in BENCHMARKS:
        print("run.py: no benchmark named %r\n\n%s" % (argv[0], usage()), file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[argv[0]][0])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
