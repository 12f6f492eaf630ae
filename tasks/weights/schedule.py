"""Which copy to start next: the file-level fan-out of `fab pull`. Pure; no I/O.

Every file starts held by the source alone (this machine). A copy needs an idle sender
and an idle receiver: each host sends at most one file and receives at most one at a
time, the source sends at most `source_streams`. A host needing a file takes it from an
idle host that holds a verified copy when there is one; from the source only when no host
holds it or is receiving it (so the source is read about once per file, and the holders
double with each round: N hosts take about log2(N) copy times). A copy that failed is
retried from another sender, and from the source after a host's copy failed twice.
A small file (config.json, an index: at most SMALL bytes) comes from the source whenever it
has a stream free: an SSH login between two hosts costs more than its bytes (about 1 s on
the lab under load, against milliseconds on the task's own connection).
"""
from dataclasses import dataclass, field

SOURCE = None  # the sender name of this machine
MAX_TRIES = 3
SMALL = 1 << 20


@dataclass
class Fanout:
    sizes: dict                       # file key -> bytes
    needs: dict                       # host -> {file key: resume offset}
    holders: dict = field(default_factory=dict)   # file key -> set of hosts holding it
    source_streams: int = 2
    sending: dict = field(default_factory=dict)   # sender (SOURCE counted) -> copies in flight
    receiving: set = field(default_factory=set)
    in_flight: dict = field(default_factory=dict)  # (host, key) -> sender
    tries: dict = field(default_factory=dict)      # (host, key) -> failed copies
    avoid: dict = field(default_factory=dict)      # (host, key) -> senders that failed it
    source_sent: set = field(default_factory=set)  # files the source sent at least once
    failed: dict = field(default_factory=dict)     # host -> reason
    can_send: set = field(default_factory=set)     # hosts that can feed others (SSH between hosts)

    def __post_init__(self):
        for key in self.sizes:
            self.holders.setdefault(key, set())

    def done(self):
        return not self.in_flight and all(not n for h, n in self.needs.items()
                                          if h not in self.failed)

    def _idle(self, sender):
        limit = self.source_streams if sender is SOURCE else 1
        return self.sending.get(sender, 0) < limit

    def _sender(self, host, key):
        if self.sizes[key] <= SMALL and self._idle(SOURCE):
            return SOURCE
        avoid = self.avoid.get((host, key), set())
        peers = sorted(h for h in self.holders[key]
                       if h in self.can_send and h not in avoid and self._idle(h))
        if peers:
            return peers[0]
        feeding = any(k == key for (_, k) in self.in_flight)
        only_source = self.tries.get((host, key), 0) >= 2 or not self.can_send
        capable = self.holders[key] & self.can_send
        if self._idle(SOURCE) and (only_source or (not capable and not feeding)):
            return SOURCE
        return False

    def next_copies(self):
        """[(sender, host, key, offset)] to start now (the largest files first)."""
        out = []
        for host in sorted(self.needs, key=lambda h: -sum(self.sizes[k] for k in self.needs[h])):
            if host in self.failed or host in self.receiving:
                continue
            for key in sorted(self.needs[host], key=lambda k: (-self.sizes[k], k)):
                if (host, key) in self.in_flight:
                    continue
                sender = self._sender(host, key)
                if sender is False:
                    continue
                self._start(sender, host, key)
                out.append((sender, host, key, self.needs[host][key]))
                break
        return out

    def _start(self, sender, host, key):
        self.sending[sender] = self.sending.get(sender, 0) + 1
        self.receiving.add(host)
        self.in_flight[(host, key)] = sender
        if sender is SOURCE:
            self.source_sent.add(key)

    def finished(self, sender, host, key, ok, *, fatal=None, offset=0):
        """A copy ended: `ok` (verified there), else retried (`fatal`: the host is out)."""
        self.sending[sender] -= 1
        self.receiving.discard(host)
        del self.in_flight[(host, key)]
        if ok:
            self.holders[key].add(host)
            del self.needs[host][key]
            return
        self.needs[host][key] = offset
        n = self.tries[(host, key)] = self.tries.get((host, key), 0) + 1
        if sender is not SOURCE:
            self.avoid.setdefault((host, key), set()).add(sender)
        if fatal or n >= MAX_TRIES:
            self.failed[host] = fatal or f"{key[1]}: {n} copies failed"
