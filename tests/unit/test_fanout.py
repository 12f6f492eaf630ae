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


def test_flow_starts_what_the_schedule_allows_and_hands_each_end_back_here():
    """A chain: item n+1 is ready only once n ended; `ended` runs in the calling thread; a
    `run` that raises hands its exception over as the outcome."""
    from tasks.fleet.fanout import flow
    started, ends, where = [], [], set()
    queue = [0]

    def ready():
        out, queue[:] = list(queue), []
        started.extend(out)
        return out

    def run(n):
        if n == 2:
            raise ValueError("two")
        return n * 10

    def ended(n, outcome):
        where.add(threading.current_thread() is threading.main_thread())
        ends.append((n, outcome if not isinstance(outcome, Exception) else str(outcome)))
        if n < 3:
            queue.append(n + 1)

    flow(ready, run, ended, poll=0.05)
    assert started == [0, 1, 2, 3] and ends == [(0, 0), (1, 10), (2, "two"), (3, 30)]
    assert where == {True}


def test_a_caller_held_host_is_neither_made_nor_closed_by_run_all():
    class Held:
        def __init__(self, name):
            self.name, self.closed = name, False

        def close(self):
            self.closed = True

    held = {n: Held(n) for n in ("a", "b")}
    out = run_all(list(held), lambda h: HostResult(h.name, summary=f"saw {id(h)}"), parallel=2,
                  reporter=Reporter(list(held)), opened=held)
    assert [r.summary for r in out] == [f"saw {id(held['a'])}", f"saw {id(held['b'])}"]
    assert not any(h.closed for h in held.values())
