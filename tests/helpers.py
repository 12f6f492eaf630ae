"""Data and helpers several test modules share (tests import from here, not from each other).

- TARGET, DRAFT: the config.json of Qwen3.6-27B and of z-lab's DFlash drafter for it, as
  the preflight's model checks read them (fields as published on their model cards).
- write_profile, vllm_profile, fab, Background, deployment, ...: driving the real `fab`
  against a lab host with the stand-in vLLM (tests/hostlab.py, tests/standins).
- VLLM, tomlish: the smallest vLLM profile, and a hypothesis strategy of TOML-ish profile
  documents (sections, keys and values a user might write, valid or not) for the fuzz tests.
"""
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from hypothesis import strategies as st

from hostlab import REPO, wait_for

HOST_PYTHON = "/usr/bin/python3"

TARGET = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 64, "vocab_size": 248320,
                    "hidden_size": 5120, "num_attention_heads": 24, "num_key_value_heads": 4,
                    "max_position_embeddings": 262144},
    "vision_config": {"hidden_size": 1152},
}
# z-lab/Qwen3.6-27B-DFlash as published: block_size at the top level, the rest in dflash_config,
# four causal sliding-window layers and one full-attention layer.
DRAFT = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
    "hidden_size": 5120, "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 2048, "max_position_embeddings": 262144, "vocab_size": 248320,
}


# -- the real `fab` against a lab host --------------------------------------------------------

def write_profile(lab, name, lines):
    path = Path(lab.root) / "fault-profiles" / f"{name}.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def vllm_profile(lab, name, host, port, env=(), *, timeout=60, workdir=None, ready=()):
    """The stand-in vLLM on `host`; `env`: STANDIN_* knobs; `ready`: extra [ready] lines."""
    lines = ["[target]", f'hosts = ["{host}"]', f'name = "{name}"']
    lines += [f'workdir = "{workdir}"'] if workdir else []
    lines += ["[server]", 'engine = "vllm"', f'python = "{lab.ml_python}"',
              f'model = "{lab.model_dir("fault-model")}"', 'host = "127.0.0.1"', f"port = {port}",
              "[server.env]"] + [f'{k} = "{v}"' for k, v in dict(env).items()]
    lines += ["[ready]", f"timeout = {timeout}", "poll_interval = 0.2", *ready]
    return write_profile(lab, name, lines)


def flat(text):
    """Human output as one line of words: host prefixes dropped, every run of whitespace one
    space. A finding is wrapped to the terminal (80 columns in a test: tasks/output.py Block);
    what it says stays a substring of this whatever the width."""
    return " ".join(" ".join(re.sub(r"^\[[^\]]+\] ", "", line) for line in text.splitlines()).split())


def fab(lab, *args, profile, code=0, env=None, timeout=240):
    """The real `fab ARGS --profile PROFILE` against the lab; it must exit `code`."""
    r = lab.fab(*args, profile=profile, timeout=timeout, env=env)
    assert r.returncode == code, f"fab {' '.join(map(str, args))} exited {r.returncode}, not {code}\n" \
                                 f"--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    return r


class Background:
    """`fab ARGS --profile P` running in the background; stdout and stderr gathered live."""

    def __init__(self, lab, *args, profile, env=None):
        argv = [sys.executable, "-m", "fabric", "-S", str(lab.ssh_config), *map(str, args),
                "--profile", str(profile)]
        self.proc = subprocess.Popen(argv, cwd=str(REPO), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=dict(os.environ, **(env or {})))
        self.out, self.err = [], []
        self._threads = [threading.Thread(target=self._read, args=(s, d), daemon=True)
                         for s, d in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream, into):
        for raw in stream:
            into.append(raw.decode("utf-8", "surrogateescape").rstrip("\n"))

    def wait_line(self, needle, timeout=60):
        return wait_for(lambda: next((l for l in self.out if needle in l), None), timeout,
                        f"{needle!r} in fab's output (so far: {self.out[-5:]} {self.err[-5:]})")

    def finish(self, timeout=120):
        code = self.proc.wait(timeout)
        for t in self._threads:
            t.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()  # an unclosed pipe is a ResourceWarning in some later test
        return code

    def close(self):
        """Kill it if still running (a failed test), and release the pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        if not self.proc.stdout.closed:
            self.finish(30)

    @property
    def text(self):
        return "\n".join(self.out + self.err)


_SQUATTER = """
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(1)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(600)
"""


def squat_port(lab, host, port, name):
    """A process of its own session on `host` holding `port` open (for 600 s); its pid, once it
    listens. The caller kills it (`lab.exec(host, ["kill", "-9", str(pid)])`)."""
    pidfile = lab.tmp(host) / f"{name}.pid"
    pidfile.unlink(missing_ok=True)
    lab.exec(host, ["setsid", "-f", HOST_PYTHON, "-c", _SQUATTER, str(port), f"/tmp/{name}.pid"],
             check=True)
    return int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 20, "the squatter"))


def deployment(lab, host, name, workdir="llmfab"):
    return Path(lab.home(host)) / workdir / name


def releases(lab, host, name):
    return sorted(p.name for p in (deployment(lab, host, name) / "releases").iterdir())


def server_record(lab, host, name):
    return json.loads((deployment(lab, host, name) / "server.json").read_text())


def host_pid_alive(lab, host, pid):
    """Alive and not a zombie, as seen inside the host."""
    r = lab.exec(host, ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return r.returncode == 0 and not r.stdout.strip().startswith("Z")


def launched_once(lab, host, name):
    """The deployment holds exactly one release, started exactly once, and it runs."""
    rels = releases(lab, host, name)
    assert len(rels) == 1, rels
    rdir = deployment(lab, host, name) / "releases" / rels[0]
    log = (rdir / "server.log").read_text(errors="replace")
    assert log.count("vLLM API server version") == 1, log  # one server process ever started
    received = json.loads((rdir / "standin-received.json").read_text())
    server = server_record(lab, host, name)
    assert received["pid"] == server["pid"] and server["release"] == rels[0]
    assert host_pid_alive(lab, host, server["pid"])
    return server




# -- profile fuzzing ---------------------------------------------------------------------------

VLLM = '[server]\nengine = "vllm"\nmodel = "/m"\n'
SECTIONS = ["", "[server]", "[server.args]", "[server.env]", "[target]", "[ready]", "[gpu]",
            "[cluster]", "[server.args.speculative-config]", "[[server.args.x]]", "[oops]"]
KEYS = ["engine", "model", "port", "host", "command", "python", "files", "args", "env", "hosts",
        "name", "workdir", "keep_releases", "timeout", "poll_interval", "health_path", "models_path",
        "served_name", "devices", "min_free_mib", "nvidia_smi", "backend", "workers", "ray_port",
        "head_address", "tensor-parallel-size", "tensor_parallel_size", "speculative-config",
        "foo-config", "HF_TOKEN", "from_env", "extends", '"a.b"', '"-x"', "server", "target"]
VALUES = ['"vllm"', '"sglang"', '"command"', '""', '"\\u0000"', "8000", "0", "-1", "99999",
          "1.5", "nan", "-inf", "true", "false", "1979-05-27T07:32:00Z", "07:32:00", "1979-05-27",
          "[]", "[1, 1]", '["local", "h"]', "[[1], [2]]", "[{ a = 1 }]", '{ from_env = "HF_TOKEN" }',
          '{ from_env = "UNSET_VAR_X" }', '{ method = "dflash", n = 15 }', "'{bad json'",
          """'{"a": [1, {"b": null}]}'""", '"../x"', '"~/ok"', '"/abs"', '"b.toml"', '"p.toml"',
          '"missing.toml"', "{}", '["x.py"]', '"/health"', "9" * 30]
line = st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)).map(lambda kv: f"{kv[0]} = {kv[1]}")
section = st.tuples(st.sampled_from(SECTIONS), st.lists(line, max_size=5)).map(
    lambda s: "\n".join([s[0]] + s[1]))
tomlish = st.lists(section, max_size=6).map("\n".join)
