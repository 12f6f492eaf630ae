"""Reading a server log as it grows: fatal lines, the lines that explain them, the phase.

Pure: fed text chunks, keeps a bounded window of recent lines. Patterns come from
what vLLM and SGLang print when they cannot go on (argparse errors, engine init
failure, CUDA OOM, port taken, NCCL/Gloo, engine death).
"""
import re
from collections import deque

FATAL = [
    (re.compile(r"^(?:[\w.-]+(?: [\w.-]+)?): error: "), "the server rejected its arguments"),
    (re.compile(r"unrecognized arguments:"), "the server rejected its arguments"),
    (re.compile(r"Engine core initialization failed"), "the engine failed to start"),
    (re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError"), "out of GPU memory"),
    (re.compile(r"Free memory on device .* is less than desired GPU memory utilization"),
     "not enough free GPU memory (another process holds it? try `fab kill-gpu-procs`)"),
    (re.compile(r"No available memory for the cache blocks"), "no GPU memory left for the KV cache"),
    (re.compile(r"Address already in use"), "the port is already in use"),
    (re.compile(r"NCCL error|Gloo connectFullMesh failed"), "collective communication failed"),
    (re.compile(r"EngineDeadError|EngineCore encountered a fatal error"), "the engine died"),
]

PHASES = [  # later phases win; matched on each new line
    ("loading", re.compile(r"Loading (?:model|weights|safetensors)|Starting to load model|Load weight|load_model")),
    ("loading", re.compile(r"Model loading took")),
    ("compiling", re.compile(r"torch\.compile|Compiling a graph|Capturing CUDA graph|cuda graph", re.I)),
    ("warming", re.compile(r"Available KV cache memory|init engine|KV cache|warm", re.I)),
    ("starting api", re.compile(r"Starting vLLM API server|Application startup complete|Uvicorn running|fired up")),
]
PHASE_ORDER = ["launched", "loading", "compiling", "warming", "starting api", "ready"]

ENGINE_PREFIX = re.compile(r"^\((?:EngineCore|Worker)[^)]*\)")


class LogScanner:
    def __init__(self, window=400):
        self.recent = deque(maxlen=window)
        self.phase = "launched"
        self.fatal = None          # (line, reason) of the first fatal line
        self.lines_seen = 0

    def feed(self, text):
        """Add complete lines; returns the first fatal (line, reason) seen so far, or None."""
        for line in text.splitlines():
            self.lines_seen += 1
            self.recent.append(line)
            if self.fatal is None:
                for pattern, reason in FATAL:
                    if pattern.search(line):
                        self.fatal = (line, reason)
                        self._fatal_index = len(self.recent) - 1
                        break
            for phase, pattern in PHASES:
                if pattern.search(line) and PHASE_ORDER.index(phase) > PHASE_ORDER.index(self.phase):
                    self.phase = phase
        return self.fatal

    def explanation(self, context=12):
        """The lines that explain the failure: engine-prefixed root-cause lines plus the tail."""
        lines = list(self.recent)
        if self.fatal is None:
            return lines[-context:]
        engine = [l for l in lines if ENGINE_PREFIX.match(l) and
                  re.search(r"ERROR|Error|error|Traceback|raise|File \"", l)]
        tail = lines[-context:]
        out = []
        for l in engine[-20:] + tail:
            if l not in out:
                out.append(l)
        if self.fatal[0] not in out:
            out.append(self.fatal[0])
        return out

    def tail(self, n=20):
        return list(self.recent)[-n:]
