"""One read-only view on a profile's `[server.args]`, for every reader of them.

    args = ServerArgs(profile.server.args)
    args.has("host")                         # dashes and underscores name the same flag
    args.get("max-model-len")                # (key as written, value) or (None, None)
    args.get("speculative-config")[1]        # a table (or dotted parts) as a dict
    args.model_paths()                       # [("server.args.speculative-config.model", "/m")]

Dotted keys (`speculative-config.model = "/m"`) are folded into a dict under their
flag, as vLLM's parser does, so a drafter named that way is found like one written as
a whole table. argv rendering (tasks/argv.py) keeps the raw pairs in file order.
"""
from .args import flag_key
from .types import JsonTable


def _is_model_key(name):
    return name == "model" or name.endswith("model_path") or name.endswith("model-path")


class ServerArgs:
    def __init__(self, args):
        self.raw = tuple(args)
        self._by_flag = {}   # normalised flag -> (key as written, value; tables as dicts)
        for name, value in self.raw:
            norm = flag_key(name)
            if isinstance(value, JsonTable):
                value = value.value()
            if "." in norm:
                whole, sub = norm.split(".", 1)
                _key, table = self._by_flag.setdefault(whole, (name.split(".", 1)[0], {}))
                if isinstance(table, dict):
                    table[sub.replace("-", "_")] = value
                continue
            self._by_flag[norm] = (name, value)

    def get(self, *names):
        """(key as written, value) of the first of `names` that is set, else (None, None)."""
        for n in names:
            hit = self._by_flag.get(flag_key(n))
            if hit is not None:
                return hit
        return None, None

    def has(self, *names):
        return self.get(*names)[0] is not None

    def flags(self):
        """{normalised flag: (key as written, value)}."""
        return dict(self._by_flag)

    def model_paths(self):
        """(profile key, absolute path) of every model directory the args name: a `model`
        or `*-model-path` flag, or such a key inside a table (the speculative drafter)."""
        out = []
        for norm, (name, value) in self._by_flag.items():
            key = f"server.args.{name}"
            if isinstance(value, dict):
                for k, v in value.items():
                    if _is_model_key(k) and isinstance(v, str) and v.startswith("/"):
                        out.append((f"{key}.{k}", v))
            elif _is_model_key(norm) and isinstance(value, str) and value.startswith("/"):
                out.append((key, value))
        return out
