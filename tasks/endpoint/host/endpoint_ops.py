"""The endpoint's host half: the facts its memory plan needs (GPUs, weights from the
safetensors headers) and the router's admin service (parking: sleep, wake, state).
Standard library only; Python >= 3.9."""
import glob
import json
import os
import struct
import urllib.error
import urllib.request

from ...gpu.host.nvsmi import NVIDIA_SMI, query_gpus

ADMIN_TIMEOUT_S = 180  # a park or wake moves a model's weights: it can take minutes
HTTP_TIMEOUT_S = 120   # one completion or sleep of a member


def safetensors_bytes(model_dir):
    """Bytes of every tensor in the *.safetensors files of `model_dir`, read from their
    headers only (8-byte little-endian header length, then JSON with data_offsets); None
    when `model_dir` is not a directory with such files or a header is unreadable."""
    path = os.path.expanduser(model_dir or "")
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else []
    if not files:
        return None
    total = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > 100 * 1024 * 1024:
                    return None
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            return None
        total += sum(t["data_offsets"][1] - t["data_offsets"][0]
                     for k, t in header.items() if k != "__metadata__")
    return total


def op_endpoint_facts(nvidia_smi=NVIDIA_SMI, models=()):
    gpus, err = query_gpus(nvidia_smi)
    return {"gpus": gpus, "gpu_error": err,
            "weights": {m: safetensors_bytes(m) for m in models or []}}


def op_endpoint_admin(port, path, method="GET"):
    """One call to the router's loopback admin service: {status, body} (body parsed JSON), or
    {status: None, error} when nothing answers there (the router is not running)."""
    url = "http://127.0.0.1:%d%s" % (int(port), path)
    r = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    try:
        with urllib.request.urlopen(r, timeout=ADMIN_TIMEOUT_S) as resp:
            status, text = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    except (OSError, ValueError) as e:
        return {"status": None, "error": str(getattr(e, "reason", e))}
    try:
        body = json.loads(text or b"null")
    except ValueError:
        body = {"raw": text.decode("utf-8", "replace")[:500]}
    return {"status": status, "body": body}


def op_endpoint_http(port, path, host_addr=None, method="GET", body=None):
    """One HTTP request to a member on this host: {status, text, seconds} or {status: None, error}.
    `body` (a string) is sent as JSON; a POST with no body sends an empty one."""
    import time
    addr = host_addr or "127.0.0.1"
    if addr in ("0.0.0.0", "::", ""):
        addr = "127.0.0.1"
    url = "http://%s:%d%s" % (addr if ":" not in addr else "[%s]" % addr, int(port), path)
    data = body.encode() if isinstance(body, str) else (b"" if method == "POST" else None)
    r = urllib.request.Request(url, data=data, method=method,
                               headers={"content-type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(r, timeout=HTTP_TIMEOUT_S) as resp:
            status, text = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    except (OSError, ValueError) as e:
        return {"status": None, "error": str(getattr(e, "reason", e))}
    return {"status": status, "text": text.decode("utf-8", "surrogateescape"),
            "seconds": time.monotonic() - t0}
