"""Every operation the host agent serves, in one table: op name -> module, function, summary.

A request `{"op": name, arguments...}` runs `<module>.<function>(**arguments)`, the module
named from the top of the host package (`doctor.host.spec_evidence`:
tasks/doctor/host/spec_evidence.py here, llmfab_host/doctor/host/spec_evidence.py on the host).
Each op is a function `op_<name>(named parameters)` whose signature says what it takes and
what it defaults to (a default the client shares is a constant both import, e.g. NVIDIA_SMI,
KEEP_RELEASES); an open-ended mapping (an environment, the doctor's section) is one named
parameter. The agent binds the arguments to the signature first, so an unknown or missing one
is a HostError naming the op and the argument. It imports a module only when the first request
for one of its ops arrives, so a task pays only for the code it uses. A new op is a row here and
its function in the module that holds its capability; tests/unit/test_agent_code.py holds the
table and the modules to each other, tests/unit/test_op_arguments.py every request in tasks/ to
its op's parameters. Standard library only; Python >= 3.9.
"""
from collections import namedtuple

OpInfo = namedtuple("OpInfo", "module function summary")

OPS = {
    # the agent itself
    "hello": OpInfo("transport.host.agent_main", "op_hello", "who answers: agent version, Python, host, user, home, pid"),
    "batch": OpInfo("transport.host.agent_main", "op_batch", "several requests in one message, in order, up to the first failure"),
    # deploy: lock, release, files, GPU baseline, launch
    "lock": OpInfo("steps.host.flock", "op_lock", "take the deployment's lock (flock) or name its holder"),
    "unlock": OpInfo("steps.host.flock", "op_unlock", "release the deployment's lock"),
    "lock_phase": OpInfo("steps.host.flock", "op_lock_phase", "say what the lock's holder does now: waiting "
                                                  "(a stop may end it) or changing the host"),
    "preflight": OpInfo("steps.host.preflight_checks", "op_preflight", "the host's checks before a launch: Python, engine, paths, "
                                                     "models, port, GPUs"),
    "host_facts": OpInfo("steps.host.preflight_checks", "op_host_facts", "engine version and GPU names: are two hosts "
                                                       "alike (fab tune)"),
    "engine_flags": OpInfo("tune.host.enginehelp", "op_engine_flags", "the flags the engine's own --help lists "
                                                            "(fab tune checks --vary server.args.X)"),
    "new_release": OpInfo("release.host.release_dirs", "op_new_release", "create releases/<UTC stamp> and return its path"),
    "discard_release": OpInfo("release.host.release_dirs", "op_discard_release", "remove a release that never launched"),
    "mark_failed": OpInfo("release.host.release_dirs", "op_mark_failed", "record in a release that it failed to start"),
    "put_file": OpInfo("transport.host.files", "op_put_file", "write one file, byte for byte, with its mode"),
    "gpu_baseline": OpInfo("gpu.host.nvsmi", "op_gpu_baseline", "record every GPU's used memory just before a launch"),
    "launch": OpInfo("release.host.launch", "op_launch", "run a release's launch.py, point `current` at it, prune"),
    # watching a server start and run
    "poll": OpInfo("steps.host.probe", "op_poll", "one wait tick: alive, new log lines, /health, /v1/models, GPU memory"),
    "watch": OpInfo("steps.host.watch", "op_watch", "wait on the host until the server is ready, dies or time runs out"),
    "state": OpInfo("steps.host.state", "op_state", "server.json, whether its group is alive, how it ended"),
    "log_tail": OpInfo("steps.host.logs", "op_log_tail", "the last lines of a release's log (optionally grep'd)"),
    "log_read": OpInfo("steps.host.logs", "op_log_read", "a release's log from an offset, waiting a while for more"),
    "kernel_oom": OpInfo("failures.host.oomkill", "op_kernel_oom", "the kernel's OOM-killer lines (dmesg)"),
    "packages": OpInfo("failures.host.pkginfo", "op_packages", "installed versions, and the torch each package "
                                                 "needs, in the server's environment"),
    "spec_evidence": OpInfo("doctor.host.spec_evidence", "op_spec_evidence", "the doctor's view of a release in one request"),
    "startup": OpInfo("startup.host.phases", "op_startup", "a ready start's phases from its log, kept as startup.json, "
                                               "with the previous start of the profile"),
    "startup_last": OpInfo("startup.host.phases", "op_startup_last", "before a launch: the previous start of this "
                                                         "profile and engine version"),
    # GPUs and processes
    "gpus": OpInfo("gpu.host.nvsmi", "op_gpus", "nvidia-smi's reading of each (selected) GPU"),
    "gpu_procs": OpInfo("gpu.host.gpuprocs", "op_gpu_procs", "every process on the selected GPUs (nvidia-smi and /proc)"),
    "gpu_holders": OpInfo("gpu.host.gpuprocs", "op_gpu_holders", "who holds memory on the selected GPUs; ours: "
                                                        "carries this deployment's release marker"),
    "stop": OpInfo("steps.host.procs", "op_stop", "stop the deployment: TERM its group, grace, KILL, sweep marked stragglers"),
    "kill_procs": OpInfo("steps.host.procs", "op_kill_procs", "TERM, then KILL, the given processes"),
    # releases
    "release_list": OpInfo("release.host.history", "op_release_list", "every release: stamp, profile hash, log size, end"),
    "release_profile": OpInfo("release.host.history", "op_release_profile", "a release's saved profile.toml"),
    "prune": OpInfo("release.host.history", "op_prune", "keep the newest N releases (never current or previous)"),
    "relaunch": OpInfo("release.host.history", "op_relaunch", "run an existing release's launch.py again"),
    # load and metrics
    "metrics": OpInfo("measure.host.loadgen", "op_metrics", "one or two /metrics snapshots"),
    "bench": OpInfo("measure.host.loadgen", "op_bench", "warm up once, then run the measured window"),
    "smoke": OpInfo("measure.host.loadgen", "op_smoke", "one 1-token completion"),
    # weights (fab pull)
    "weights_plan": OpInfo("weights.host.receiver", "op_weights_plan", "which model files are present and verified, "
                                                         "which partial; bytes needed and free"),
    "weights_lock": OpInfo("weights.host.access", "op_weights_lock", "lock the model directories for this pull, "
                                                       "or name the running pull that holds one"),
    "weights_prepare": OpInfo("weights.host.access", "op_weights_prepare", "lock the model directories, create "
                                                             "them, install the receiver, drop ended pulls' keys"),
    "weights_grant": OpInfo("weights.host.access", "op_weights_grant", "authorise the pull's key from its hosts "
                                                         "only, as the receiver, with an expiry"),
    "weights_revoke": OpInfo("weights.host.access", "op_weights_revoke", "remove what a pull authorised here"),
    "weights_send": OpInfo("weights.host.receiver", "op_weights_send", "stream a verified file to another host over SSH"),
    "weights_manifest": OpInfo("weights.host.receiver", "op_weights_manifest", "remove the earlier pull's files the source "
                                                                 "lacks, write .llmfab-manifest.json beside the weights"),
    # endpoints (several deployments behind one router)
    "endpoint_facts": OpInfo("endpoint.host.endpoint_ops", "op_endpoint_facts", "what an endpoint's memory plan "
                                                                "reads: GPUs, weights from safetensors headers"),
    "endpoint_admin": OpInfo("endpoint.host.endpoint_ops", "op_endpoint_admin", "one call to the endpoint router's "
                                                                "admin service (park, wake, state)"),
    "endpoint_http": OpInfo("endpoint.host.endpoint_ops", "op_endpoint_http", "one HTTP request to an endpoint "
                                                              "member on this host (check completion, sleep)"),
    # Ray clusters
    "ray_address": OpInfo("fleet.host.ray_node", "op_ray_address", "the head node's address"),
    "ray_start": OpInfo("fleet.host.ray_node", "op_ray_start", "start this Ray node (head or worker) detached"),
    "ray_stop": OpInfo("fleet.host.ray_node", "op_ray_stop", "stop this Ray node"),
    "ray_cluster": OpInfo("fleet.host.ray_node", "op_ray_cluster", "the cluster as the head's GCS sees it"),
}
