"""Ansible (ansible-core) and pyinfra for the comparison, from a throwaway venv.

Both do what every other tool in the launch benchmark does: copy the 2 KB launcher
to ~/x.py and start it detached with the same one-line shell command, reading the
pid. Each is set up the way a practitioner would to be quick:

- Ansible: no fact gathering, pipelining on, the interpreter given (no discovery),
  OpenSSH with the lab's ssh_config and ControlMaster/ControlPersist (its default),
  a fresh ControlPath directory per run so no run reuses a warm master connection,
  forks 16, and a plain `shell` task (async + poll 0 costs more round trips).
- pyinfra: the lab's ssh_config, `files.put(force=True)`, `server.shell`.

The launcher carries a fresh nonce line per run, so both really copy it (Ansible's
copy and pyinfra's put skip a file whose checksum already matches).
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = ("ansible-core", "pyinfra")
LAUNCH = "setsid nohup /usr/bin/python3 x.py >x.log 2>&1 </dev/null & echo $!"

PLAYBOOK = """\
- hosts: all
  gather_facts: false
  tasks:
    - name: copy the launcher
      copy: {src: "{{ launcher }}", dest: /root/x.py, mode: "0644"}
    - name: launch it detached
      shell: "%s"
      args: {chdir: /root}
""" % LAUNCH.replace('"', '\\"')

ANSIBLE_CFG = """\
[defaults]
forks = 16
interpreter_python = /usr/bin/python3
gathering = explicit
retry_files_enabled = False
deprecation_warnings = False
[ssh_connection]
pipelining = True
ssh_args = -F {ssh_config} -o ControlMaster=auto -o ControlPersist=10s
"""

PYINFRA_DEPLOY = """\
import os
from pyinfra.operations import files, server
files.put(name="copy the launcher", src=os.environ["LLMFAB_BENCH_LAUNCHER"], dest="/root/x.py",
          force=True)
server.shell(name="launch it detached", commands=[%r])
""" % ("cd /root && " + LAUNCH)


def ensure_venv(venv, python=sys.executable, timeout=900):
    """Create `venv` with ansible-core and pyinfra unless it has them.

    Returns ({"ansible": argv0 or None, "pyinfra": argv0 or None}, note or None).
    """
    venv = Path(venv)
    bins = {"ansible": venv / "bin" / "ansible-playbook", "pyinfra": venv / "bin" / "pyinfra"}
    if not all(p.exists() for p in bins.values()):
        try:
            if not (venv / "bin" / "python").exists():
                subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True,
                               timeout=timeout)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *PACKAGES], check=True,
                           capture_output=True, text=True, timeout=timeout)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            err = getattr(e, "stderr", None) or str(e)
            note = "could not install %s into %s: %s" % (" ".join(PACKAGES), venv,
                                                        str(err).strip().splitlines()[-1:])
            return {k: str(p) if p.exists() else None for k, p in bins.items()}, note
    return {k: str(p) for k, p in bins.items()}, None


def versions(bins):
    """{"ansible": "ansible-core 2.x", "pyinfra": "pyinfra 3.x"} (only for installed ones)."""
    out = {}
    for tool, argv0 in bins.items():
        if not argv0:
            continue
        py = str(Path(argv0).parent / "python")
        pkg = "ansible-core" if tool == "ansible" else "pyinfra"
        r = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version(%r))" % pkg],
                           capture_output=True, text=True)
        out[tool] = "%s %s" % (pkg, r.stdout.strip() or "?")
    return out


class Workspace:
    """Inventories, config and playbooks for one lab, under `root`."""

    def __init__(self, root, ssh_config, known_hosts, hosts):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.ssh_config = str(ssh_config)
        (self.root / "ansible.cfg").write_text(ANSIBLE_CFG.format(ssh_config=ssh_config))
        (self.root / "play.yml").write_text(PLAYBOOK)
        (self.root / "pyinfra_deploy.py").write_text(PYINFRA_DEPLOY)
        self.known_hosts = str(known_hosts)
        self.all_hosts = list(hosts)

    def ansible_argv(self, bins, hosts):
        inv = self.root / ("inventory-%d.ini" % len(hosts))
        inv.write_text("[bench]\n" + "".join("%s\n" % h for h in hosts))
        return [bins["ansible"], "-i", str(inv), str(self.root / "play.yml")]

    def ansible_env(self, launcher):
        cp = tempfile.mkdtemp(prefix="cp-", dir=self.root)  # cold: no warm master to reuse
        env = dict(os.environ, ANSIBLE_CONFIG=str(self.root / "ansible.cfg"),
                   ANSIBLE_SSH_CONTROL_PATH_DIR=cp, ANSIBLE_LOCAL_TEMP=str(self.root / "tmp"),
                   ANSIBLE_NOCOLOR="1")
        return env, ["-e", "launcher=%s" % launcher], cp

    def pyinfra_argv(self, bins, hosts):
        inv = self.root / ("pyinfra_inventory_%d.py" % len(hosts))
        data = {"ssh_config_file": self.ssh_config, "ssh_known_hosts_file": self.known_hosts,
                "ssh_strict_host_key_checking": "yes"}
        inv.write_text("hosts = %r\n" % ([(h, data) for h in hosts],))
        return [bins["pyinfra"], "-y", str(inv), str(self.root / "pyinfra_deploy.py")]

    def pyinfra_env(self, launcher):
        return dict(os.environ, LLMFAB_BENCH_LAUNCHER=str(launcher), PYINFRA_PROGRESS="off")
