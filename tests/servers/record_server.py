"""A tiny server for tests: records its exact argv and environment, then serves /health.

Run by llmfab as an `engine = "command"` server (shipped via server.files). It writes
record.json in its cwd (the release directory) with argv and environ as lists of byte
values (hex), so the test can compare them byte for byte, then serves /health and
/v1/models on --port. Standard library only.
"""
import http.server
import json
import os
import sys


def main():
    record = {
        "argv": [os.fsencode(a).hex() for a in sys.argv],
        "env": {os.fsencode(k).hex(): os.fsencode(v).hex() for k, v in os.environ.items()},
    }
    with open("record.json.tmp", "w") as f:
        json.dump(record, f)
    os.replace("record.json.tmp", "record.json")
    port = int(sys.argv[sys.argv.index("--port") + 1])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"object":"list","data":[{"id":"recorder","object":"model"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
