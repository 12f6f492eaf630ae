"""The fan-out without a host: --parallel bounds how many hosts run at once."""
import threading
import time
from tasks.fleet.fanout import HostResult, run_all
from tasks.output import Reporter


def test_parallel_bounds_how_many_hosts_run_at_once():
    names = [f"n{i}" for i in range(12)]
    lock, now, peak = threading.Lock(), [0], [0]
    release = threading.Event()

    def op(host):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
            if now[0] == 3:
                release.set()
        release.wait(5)
        time.sleep(0.02)  # give a fourth worker, if there were one, the chance to start
        with lock:
            now[0] -= 1
        return HostResult(host.name)

    out = run_all(names, op, parallel=3, reporter=Reporter(names), host_kwargs={})
    assert [r.host for r in out] == names and peak[0] == 3
