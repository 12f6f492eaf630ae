#!/usr/bin/env bash
# Baseline: the plain OpenSSH one-liner of issue 8, on every host at once.
#
#   benchmarks/baseline_ssh.sh SSH_CONFIG HOST [HOST...]
#
# One `ssh` per host, all in parallel: `setsid nohup PY x.py >x.log 2>&1 </dev/null & echo $!`.
# As in the issue, x.py (benchmarks/tiny_server.py) is already in each host's home: nothing is
# copied. PY is $BASELINE_PY (default /usr/bin/python3, the interpreter every case uses; the
# lab's `python3` on PATH is a pyenv shim). Extra ssh options come from $BASELINE_SSH_OPTS
# (e.g. "-o KexAlgorithms=curve25519-sha256"). Prints "HOST PID" per host; exits 1 if any
# host failed.
set -u
cfg=$1
shift
py=${BASELINE_PY:-/usr/bin/python3}
read -r -a extra <<< "${BASELINE_SSH_OPTS:-}"
for host in "$@"; do
    (
        pid=$(ssh -F "$cfg" "${extra[@]}" "$host" \
            "setsid nohup $py x.py >x.log 2>&1 </dev/null & echo \$!") || exit 1
        echo "$host $pid"
    ) &
done
status=0
for job in $(jobs -p); do
    wait "$job" || status=1
done
exit $status
