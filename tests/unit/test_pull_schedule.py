"""The fan-out schedule of `fab pull` (tasks/weights/schedule.py), simulated in copy times."""
import heapq

from tasks.weights.schedule import SOURCE, Fanout


def simulate(n_hosts, n_files, *, fail=()):
    """Copy times until every host holds every file (each copy takes 1), and how many
    copies the source sent; `fail`: (host, file) pairs whose first copy fails."""
    sizes = {("/m", f"f{i}"): 100 << 20 for i in range(n_files)}
    hosts = [f"h{i}" for i in range(1, n_hosts + 1)]
    fan = Fanout(sizes=sizes, needs={h: {k: 0 for k in sizes} for h in hosts}, can_send=set(hosts))
    t, events, from_source, failing = 0, [], 0, set(fail)
    while not fan.done():
        for sender, host, key, _ in fan.next_copies():
            from_source += sender is SOURCE
            heapq.heappush(events, (t + 1, str(sender), sender, host, key))
        t, _, sender, host, key = heapq.heappop(events)
        ok = (host, key[1]) not in failing
        failing.discard((host, key[1]))
        fan.finished(sender, host, key, ok)
    return t, from_source


def test_n_hosts_take_about_log2_n_copy_times_and_the_source_is_read_once():
    one, sent = simulate(1, 4)
    assert (one, sent) == (4, 4)
    for n in (2, 4, 8, 16):
        t, sent = simulate(n, 4)
        assert sent == 4, (n, sent)              # each file left this machine once
        assert t <= 2.5 * one, (n, t)            # not n times one host's copy


def test_a_failed_copy_is_retried_and_the_others_still_finish():
    t, sent = simulate(8, 4, fail=[("h3", "f0"), ("h5", "f2")])
    assert sent <= 6 and t <= 12


def test_a_host_out_of_the_pull_stops_getting_copies():
    sizes = {("/m", "a"): 10 << 20}
    fan = Fanout(sizes=sizes, needs={"h1": {("/m", "a"): 0}, "h2": {("/m", "a"): 0}},
                 can_send={"h1", "h2"})
    (sender, host, key, _), = fan.next_copies()
    assert sender is SOURCE
    fan.finished(sender, host, key, False, fatal="disk full")
    assert fan.failed == {host: "disk full"}
    rest = fan.next_copies()
    assert [c[1] for c in rest] == [h for h in ("h1", "h2") if h != host]
    fan.finished(*rest[0][:3], True)
    assert fan.done()


def test_without_ssh_between_hosts_each_host_gets_every_file_from_here():
    sizes = {("/m", "a"): 10 << 20}
    fan = Fanout(sizes=sizes, needs={"h1": {("/m", "a"): 5}, "h2": {("/m", "a"): 0}}, can_send=set())
    copies = fan.next_copies()
    assert sorted((c[0], c[1], c[3]) for c in copies) == [(SOURCE, "h1", 5), (SOURCE, "h2", 0)]


def test_a_small_file_comes_from_here_even_when_a_host_holds_it():
    sizes = {("/m", "big"): 100 << 20, ("/m", "config.json"): 500}
    fan = Fanout(sizes=sizes, needs={"h2": {("/m", "config.json"): 0}}, can_send={"h1", "h2"},
                 holders={("/m", "config.json"): {"h1"}, ("/m", "big"): {"h1"}})
    assert [(c[0], c[1]) for c in fan.next_copies()] == [(SOURCE, "h2")]
    fan = Fanout(sizes=sizes, needs={"h2": {("/m", "big"): 0}}, can_send={"h1", "h2"},
                 holders={("/m", "config.json"): {"h1"}, ("/m", "big"): {"h1"}})
    assert [(c[0], c[1]) for c in fan.next_copies()] == [("h1", "h2")]
