"""A server whose every word is hostile to a terminal, for `engine = "command"` tests.

    python3 hostile_server.py --port N          serve /health and /v1/models, log hostile lines
    python3 hostile_server.py --port N --die    log them, then fail as argparse fails

What it writes is what a compromised or careless server could write, byte for byte: escape
sequences that set the window title (OSC 0), write the clipboard (OSC 52), open a hyperlink
(OSC 8) and colour the text (SGR); a carriage return that hides what came before it on a
line; a NUL; a C1 CSI (U+009B); a bidirectional override; and one line of 200,000 bytes.
Its /v1/models lists an id holding a window-title sequence. With --die its last line is an
argparse error naming an "unknown flag" that itself holds an escape sequence, written WITHOUT
a trailing newline (a process that dies mid-line), and it exits 2 as argparse does.
Nothing here is faked: llmfab reads these bytes from a real log and a real socket.
"""
import http.server
import json
import sys

ESC, BEL, ST = "\x1b", "\x07", "\x1b\\"
LINES = [
    "hostile: title " + ESC + "]0;PWNED-TITLE" + BEL + " end",
    "hostile: clipboard " + ESC + "]52;c;cm0gLXJmIH4=" + BEL + " end",
    "hostile: link " + ESC + "]8;;http://evil.invalid/" + ST + "click" + ESC + "]8;;" + ST + " end",
    "hostile: colour " + ESC + "[31mRED" + ESC + "[0m end",
    "hostile: carriage safe\rEVIL-OVERWRITE",
    "hostile: nul a\x00b end",
    "hostile: c1 \x9b31m end",
    "hostile: bidi \u202eevil\u202c end",
    "hostile: long " + "A" * 200000,
]
MODEL_ID = "model" + ESC + "]0;PWNED-MODEL" + BEL + "-id"
DIE_LINE = ("hostile_server.py: error: unrecognized arguments: --" + ESC + "]0;PWNED-FLAG" + BEL
            + "flag")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            body = b"ok"
        elif self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    port = int(sys.argv[sys.argv.index("--port") + 1])
    out = sys.stdout.buffer
    for line in LINES:
        out.write(line.encode("utf-8") + b"\n")
    out.flush()
    if "--die" in sys.argv:
        out.write(DIE_LINE.encode("utf-8"))  # no newline: the process dies mid-line
        out.flush()
        sys.exit(2)
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
