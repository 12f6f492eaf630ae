"""End to end: an endpoint (tasks/endpoint/) on a lab host over real SSH: stand-in vLLM members
behind the real HAProxy, planned by GPU memory, routed by `model`, parked and woken by a
request, `fab sleep` / `fab wake`, status, a member that fails to start, a plan that does not
fit, a router that dies, stop of one member leaving the other serving, stop of all; a
changed member moved to its other slot under load with no failed request, the not-fitting
case parked and rolled back, and a park that lets requests in flight finish."""
import functools
import json
import os

import pytest

import helpers
from helpers import write_profile
from hostlab import HostLab, wait_for

pytestmark = pytest.mark.e2e  # haproxy: .ci/run installs it

MIB = 2048     # each member's fake GPU memory (a quarter kept by the server while asleep)
BASELINE = 4   # the stand-in driver's idle reading per GPU
fab = functools.partial(helpers.fab, timeout=240)


@pytest.fixture(scope="module")
def lab():
    with HostLab(1) as lab:
        yield lab


def member(lab, name, port, *, extra_env=(), args=("gpu-memory-utilization = 0.2",), tokens_per_s=2000):
    lines = ["[target]", 'hosts = ["h1"]', f'name = "{name}"', "[server]", 'engine = "vllm"',
             f'python = "{lab.ml_python}"', f'model = "{lab.model_dir("m-" + name)}"', 'host = "127.0.0.1"',
             f"port = {port}", "[server.args]", f'served-model-name = "{name}-model"', "enable-sleep-mode = true",
             *args, "[server.env]", 'VLLM_SERVER_DEV_MODE = "1"', 'CUDA_VISIBLE_DEVICES = "0"',
             f'STANDIN_GPU_MIB = "{MIB}"', f'STANDIN_TOKENS_PER_S = "{tokens_per_s}"',
             *[f'{k} = "{v}"' for k, v in extra_env], "[ready]", "timeout = 60", "poll_interval = 0.2"]
    return write_profile(lab, name, lines)


def endpoint(lab, name, port, members, *extra):
    lines = ["[endpoint]", f'name = "{name}"', f"port = {port}", f"admin_port = {port + 9}",
             f"members = {json.dumps([str(m) for m in members])}", 'haproxy = "/usr/sbin/haproxy"', *extra]
    return write_profile(lab, name, lines)


def call(lab, port, path, body=None, timeout=30):
    """(status, parsed body) of a request to the endpoint on h1, made on h1 itself."""
    code = ("import json,sys,urllib.request,urllib.error\n"
            "a=json.loads(sys.argv[1])\n"
            "r=urllib.request.Request('http://127.0.0.1:%d%s'%(a['port'],a['path']),"
            "None if a['body'] is None else json.dumps(a['body']).encode(),{'content-type':'application/json'})\n"
            "try:\n r=urllib.request.urlopen(r,timeout=a['t']);print(r.status);print(r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n print(e.code);print(e.read().decode())\n")
    r = lab.exec("h1", ["python3", "-c", code, json.dumps({"port": port, "path": path, "body": body, "t": timeout})],
                 capture_output=True, text=True, check=True, timeout=timeout + 10)
    status, _, text = r.stdout.partition("\n")
    try:
        return int(status), json.loads(text)
    except ValueError:  # HAProxy's own 503 page
        return int(status), text


def used(lab):
    r = lab.exec("h1", ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                 capture_output=True, text=True, check=True)
    return {int(i): int(m) for i, m in (line.split(", ") for line in r.stdout.splitlines())}[0]


def test_endpoint_routes_parks_wakes_and_stops(lab):
    chat = member(lab, "chat", 8201)
    coder = member(lab, "coder", 8202)
    ep = endpoint(lab, "box", 8200, [chat, coder])
    r = fab(lab, "deploy", profile=ep)
    out = r.stdout
    assert "GPU 0" in out and "fits" in out and "coder" in out
    assert "member chat (1/2)" in out and "member coder (2/2)" in out and "router (HAProxy" in out
    assert used(lab) == BASELINE + 2 * MIB

    status, models = call(lab, 8200, "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["chat-model", "coder-model"]
    status, body = call(lab, 8200, "/v1/completions", {"model": "chat-model", "prompt": "hi", "max_tokens": 3})
    assert status == 200 and body["model"] == "chat-model"
    status, body = call(lab, 8200, "/v1/completions", {"model": "nope", "prompt": "hi"})
    assert status == 404 and body["error"]["code"] == 404
    assert "`nope`" in body["error"]["message"] and "chat-model, coder-model" in body["error"]["message"]

    st = fab(lab, "status", profile=ep).stdout
    assert "member chat" in st and "member coder" in st and "router box" in st
    assert "chat (chat-model): awake" in st

    # Stop of one member leaves the other serving through the endpoint.
    fab(lab, "stop", profile=coder)
    status, body = call(lab, 8200, "/v1/completions", {"model": "chat-model", "prompt": "hi", "max_tokens": 2})
    assert status == 200
    status, _ = call(lab, 8200, "/v1/completions", {"model": "coder-model", "prompt": "hi", "max_tokens": 2})
    assert status == 503

    r = fab(lab, "stop", profile=ep, code=0)
    assert r.stdout.index("router box") < r.stdout.index("member chat")  # the router first
    assert used(lab) == BASELINE


def test_plan_that_does_not_fit_starts_nothing(lab):
    big = member(lab, "big1", 8211, args=["gpu-memory-utilization = 0.6"])
    big2 = member(lab, "big2", 8212, args=["gpu-memory-utilization = 0.6"])
    ep = endpoint(lab, "toobig", 8210, [big, big2])
    r = fab(lab, "deploy", profile=ep, code=1)
    text = helpers.flat(r.stdout + r.stderr)
    assert "DOES NOT FIT" in text and "the members do not fit" in text and "Nothing was started" in text
    assert "gpu-memory-utilization 0.6 x 81559 MiB" in text
    assert used(lab) == BASELINE


def test_member_that_fails_to_start_is_named_and_no_router_starts(lab):
    ok = member(lab, "okm", 8221)
    bad = member(lab, "badm", 8222, extra_env=[("STANDIN_FAIL", "oom")])
    ep = endpoint(lab, "broken", 8220, [ok, bad])
    r = fab(lab, "deploy", profile=ep, code=1)
    assert "member badm did not start" in r.stdout and "Members running: okm" in r.stdout
    assert "the router was not started" in r.stdout
    assert "CUDA out of memory" in r.stdout + r.stderr
    fab(lab, "stop", profile=ep)
    assert used(lab) == BASELINE


def test_a_router_that_dies_is_seen_and_restarted_by_deploy(lab):
    a = member(lab, "solo", 8231)
    ep = endpoint(lab, "lone", 8230, [a])
    fab(lab, "deploy", profile=ep)
    st = json.loads(lab.exec("h1", ["cat", os.path.expanduser("~") + "/llmfab/lone/current/server.json"],
                             capture_output=True, text=True).stdout or "{}") if False else None
    del st
    r = fab(lab, "status", profile=ep)
    assert "solo (solo-model): awake" in r.stdout
    pid = int(lab.exec("h1", ["pgrep", "-f", "haproxy -db -f haproxy.cfg"], capture_output=True, text=True)
              .stdout.split()[0])
    lab.exec("h1", ["kill", "-9", str(pid)], check=True)
    wait_for(lambda: lab.exec("h1", ["kill", "-0", str(pid)]).returncode != 0, 10, "the router to die")
    r = fab(lab, "status", profile=ep, code=1)
    assert "parking state unknown: the router's admin port 8239" in r.stdout
    fab(lab, "deploy", profile=ep)
    assert call(lab, 8230, "/v1/completions", {"model": "solo-model", "prompt": "x", "max_tokens": 1})[0] == 200
    fab(lab, "stop", profile=ep)


def test_a_parked_member_is_woken_by_a_request_through_the_router(lab):
    """fab sleep parks a member (its memory given back but what a sleeping server keeps), a
    request for its model through the endpoint wakes it and is answered (its wait is the
    wake), status says asleep, then awake with the wake counted; fab wake of an awake member
    is a no-op; the sibling serves throughout."""
    a, b = member(lab, "parkme", 8241), member(lab, "sibling", 8242)
    ep = endpoint(lab, "parks", 8240, [a, b])
    fab(lab, "deploy", profile=ep)
    try:
        r = fab(lab, "sleep", "--member", "parkme", profile=ep)
        assert "parkme: parked in" in r.stdout, r.stdout
        assert used(lab) == BASELINE + MIB + MIB // 4  # the stand-in keeps a quarter asleep
        st = fab(lab, "status", profile=ep).stdout
        assert "parkme (parkme-model): asleep" in st and "sibling (sibling-model): awake" in st, st
        # the member's own status: asleep, though its /health answers 200
        rec = json.loads(fab(lab, "status", "--json", profile=a).stdout)
        assert rec["health"] == 200 and rec["asleep"] is True, rec
        assert "asleep (vLLM sleep mode)" in fab(lab, "status", profile=a).stdout
        assert json.loads(fab(lab, "status", "--json", profile=b).stdout)["asleep"] is False
        status, models = call(lab, 8240, "/v1/models")
        assert status == 200 and {m["id"] for m in models["data"]} == {"parkme-model", "sibling-model"}
        status, body = call(lab, 8240, "/v1/completions", {"model": "sibling-model", "prompt": "hi", "max_tokens": 2})
        assert status == 200

        status, body = call(lab, 8240, "/v1/completions", {"model": "parkme-model", "prompt": "hi", "max_tokens": 3},
                            timeout=60)
        assert status == 200 and body["model"] == "parkme-model", body
        assert used(lab) == BASELINE + 2 * MIB
        st = fab(lab, "status", profile=ep).stdout
        assert "parkme (parkme-model): awake" in st and "wakes 1" in st, st
        r = fab(lab, "wake", "--member", "parkme", profile=ep)
        assert "parkme: awake in" in r.stdout
    finally:
        lab.fab("stop", profile=ep, timeout=240)
    assert used(lab) == BASELINE


LOADER = r"""
import json, os, sys, threading, time, urllib.request, urllib.error
port, model, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3]
codes, lock = {}, threading.Lock()
def worker():
    while not os.path.exists(stop):
        body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 20, "stream": True}).encode()
        req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, body,
                                     {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read().decode()
                whole = text.rstrip().endswith("data: [DONE]") and '"finish_reason": "abort"' not in text
                code = r.status if whole else "cut"
        except urllib.error.HTTPError as e:
            code = e.code
        except OSError as e:
            code = type(e).__name__
        with lock:
            codes[str(code)] = codes.get(str(code), 0) + 1
threads = [threading.Thread(target=worker) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(codes))
"""


class Load:
    """Streamed completions for `model` through the endpoint on h1, 4 at a time, until stopped:
    the HTTP status (or how it failed) of every one."""

    def __init__(self, lab, port, model):
        self.lab, self.stop_file = lab, f"/root/stop-load-{model}"
        lab.exec("h1", ["rm", "-f", self.stop_file], check=True)
        self.proc = __import__("subprocess").Popen(
            lab.ssh_argv("h1", "python3", "-", str(port), model, self.stop_file),
            stdin=-1, stdout=-1, text=True)
        self.proc.stdin.write(LOADER)
        self.proc.stdin.close()

    def stop(self):
        self.lab.exec("h1", ["touch", self.stop_file], check=True)
        out = self.proc.stdout.read()
        self.proc.wait(timeout=90)
        return json.loads(out)


def test_a_changed_member_moves_to_its_other_slot_with_no_failed_request(lab):
    """A redeploy of a running endpoint: the changed member's new release starts in its second
    slot beside the old one, the router switches once it answers, the old one drains and stops;
    under steady streamed load no request fails; the unchanged member is left alone."""
    a, b = member(lab, "mover", 8251, tokens_per_s=100), member(lab, "stay", 8252)
    ep = endpoint(lab, "moves", 8250, [a, b])
    fab(lab, "deploy", profile=ep)
    try:
        load = Load(lab, 8250, "mover-model")
        wait_for(lambda: call(lab, 8259, "/state")[0] == 200, 30, "the router's admin port")
        member(lab, "mover", 8251, tokens_per_s=100, extra_env=[("RELEASE_TAG", "2")])
        out = fab(lab, "deploy", profile=ep).stdout
        codes = load.stop()
        print("requests through the endpoint during the redeploy:", codes)
        assert set(codes) == {"200"} and codes["200"] > 10, codes
        assert "member mover: new release in slot b (port 9251)" in out, out
        assert "member stay: unchanged" in out and "slot a drained; stopping it" in out, out
        assert used(lab) == BASELINE + 2 * MIB  # the old release stopped: its memory back
        st = fab(lab, "status", profile=ep).stdout
        assert "mover (mover-model): awake, slot b (port 9251)" in st, st
        assert "stay (stay-model): awake, slot a (port 8252)" in st, st
        # a redeploy with nothing changed moves nothing
        out = fab(lab, "deploy", profile=ep).stdout
        assert "0 member(s) moved" in out and "member mover: unchanged" in out, out
    finally:
        r = lab.fab("stop", profile=ep, timeout=240)
    assert "member mover (slot b, port 9251)" in r.stdout
    assert used(lab) == BASELINE


def test_where_two_releases_do_not_fit_the_old_is_parked_and_rollback_is_a_wake_and_a_switch(lab):
    """A member taking 0.99 of the GPU: its new release cannot start beside the old, so the old is
    parked (a request meanwhile gets a 503 saying why) and stays parked after the switch; fab
    rollback wakes it and switches back in seconds, parking the newer one; stop ends both."""
    big = member(lab, "big", 8261, args=["gpu-memory-utilization = 0.99"])
    ep = endpoint(lab, "bigbox", 8260, [big])
    fab(lab, "deploy", profile=ep)
    try:
        member(lab, "big", 8261, args=["gpu-memory-utilization = 0.99"], extra_env=[("RELEASE_TAG", "2")])
        load = Load(lab, 8260, "big-model")
        wait_for(lambda: call(lab, 8269, "/state")[0] == 200, 30, "the router's admin port")
        out = fab(lab, "deploy", profile=ep).stdout
        codes = load.stop()
        print("requests for the parked member during its redeploy:", codes)
        assert set(codes) <= {"200", "503"} and codes.get("200"), codes  # held: 503, never a hang
        assert "member big: new release in slot b (port 9261) on h1, the old one parked meanwhile" in out, out
        assert "slot a stays parked" in out, out
        assert used(lab) == BASELINE + MIB + MIB // 4  # the new awake, the old asleep
        assert call(lab, 8260, "/v1/completions", {"model": "big-model", "prompt": "x", "max_tokens": 2})[0] == 200
        st = fab(lab, "status", profile=ep).stdout
        assert "big (big-model): awake, slot b (port 9261), other slot parked" in st, st

        r = fab(lab, "rollback", profile=ep)
        assert "member big: back to the parked release in slot a (port 8261)" in r.stdout, r.stdout
        assert "the router sends it to slot a" in r.stdout
        assert used(lab) == BASELINE + MIB + MIB // 4
        assert call(lab, 8260, "/v1/completions", {"model": "big-model", "prompt": "x", "max_tokens": 2})[0] == 200
        assert "big (big-model): awake, slot a (port 8261), other slot parked" in fab(lab, "status", profile=ep).stdout
        rel = fab(lab, "releases", profile=ep).stdout
        assert "member big (slot a, port 8261)" in rel and "member big (slot b, port 9261)" in rel, rel
    finally:
        lab.fab("stop", profile=ep, timeout=240)
    assert used(lab) == BASELINE


SLEEP_DURING_A_STREAM = r"""
import json, sys, threading, urllib.request
stream_port, sleep_url = int(sys.argv[1]), sys.argv[2]
body = json.dumps({"model": "drainme-model", "prompt": "hi", "max_tokens": 100, "stream": True}).encode()
r = urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:%d/v1/completions" % stream_port, body,
                                                  {"content-type": "application/json"}), timeout=60)
first = r.readline()  # the stream is under way
done = {}
def put_to_sleep():
    urllib.request.urlopen(urllib.request.Request(sleep_url, b"", method="POST"), timeout=60).read()
    done["slept"] = True
t = threading.Thread(target=put_to_sleep)
t.start()
rest = first + r.read()
done["stream_ended_before_sleep_answered"] = "slept" not in done
t.join()
text = rest.decode()
print(json.dumps({"finish": sorted(set(c["choices"][0]["finish_reason"] or "-" for c in
                                      (json.loads(x[6:]) for x in text.split("\n") if x.startswith("data: {")))),
                  "done": text.rstrip().endswith("data: [DONE]"), **done}))
"""


def test_a_park_lets_the_requests_in_flight_finish_where_a_bare_sleep_aborts_them(lab):
    """vLLM's sleep aborts the requests it runs (its default mode; on the H200 every stream in
    flight was cut): the stand-in does the same when slept directly, while the router's park
    (fab sleep, and a redeploy's park) waits for them to finish before it sleeps the server."""
    m = member(lab, "drainme", 8271, tokens_per_s=50)  # 100 tokens: 2 s of stream
    ep = endpoint(lab, "drains", 8270, [m])
    fab(lab, "deploy", profile=ep)
    try:
        def run(stream_port, sleep_url):
            r = lab.exec("h1", ["python3", "-c", SLEEP_DURING_A_STREAM, str(stream_port), sleep_url],
                         capture_output=True, text=True, timeout=90)
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)
        bare = run(8271, "http://127.0.0.1:8271/sleep?level=1")
        assert "abort" in bare["finish"] and bare["done"], bare  # cut short, as on the H200
        assert call(lab, 8271, "/wake_up", {})[0] == 200  # slept behind the router's back: woken the same way
        parked = run(8270, "http://127.0.0.1:8279/sleep?member=drainme")
        assert parked["finish"] == ["-", "length"] and parked["done"], parked  # whole
        assert parked["stream_ended_before_sleep_answered"], parked
    finally:
        lab.fab("stop", profile=ep, timeout=240)
