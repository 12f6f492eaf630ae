"""What vLLM's FlexibleArgumentParser does to argv before argparse sees it (stand-in).

Behaviour reproduced from vLLM's vllm/utils/argparse_utils.py:
- `--flag_name` is rewritten to `--flag-name` (only the part after `--` and before the
  first `.`; values are untouched);
- `--json-flag.key value` / `--json-flag.key=value` (dotted keys) are merged into one JSON
  object per flag and appended as `--json-flag '{...}'` AFTER the other arguments, so they
  win over a whole-JSON value for the same flag; each value is tried as JSON, then as a
  human-readable int (`1k` -> 1000), then kept as a string; `key+` appends list items;
- `vllm serve ... --model M` moves M to the positional model (with a warning);
- `--served-model-name` without a positional model is a ValueError.
`--config FILE.yaml` is not supported by this stand-in (llmfab never emits it).
"""
import argparse
import json
import re
import sys
from collections import defaultdict

from vllm.logger import log


def human_readable_int(value):
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}
        binary = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        try:
            return int(number) * binary[suffix]
        except ValueError:
            raise argparse.ArgumentTypeError(
                "Decimals are not allowed with binary suffixes like %s. Did you mean to use "
                "%s%s instead?" % (suffix, number, suffix.lower())) from None
    return int(value)


def _nested(keys, value):
    for key in reversed(keys):
        value = {key: value}
    return value


def _merge(original, update):
    duplicates = set()
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(original.get(k), dict):
            duplicates |= {"%s.%s" % (k, d) for d in _merge(original[k], v)}
        elif isinstance(v, list) and isinstance(original.get(k), list):
            original[k] += v
        else:
            if k in original:
                duplicates.add(k)
            original[k] = v
    return duplicates


class FlexibleArgumentParser(argparse.ArgumentParser):
    """ArgumentParser that allows both underscore and dash in names."""

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        if args and args[0] == "serve":
            args = self._serve_model_first(args)
        processed = []
        for arg in args:
            if arg.startswith("--"):
                key, eq, value = arg.partition("=")
                head, dot, tail = key[2:].partition(".")
                processed.append("--" + head.replace("_", "-") + dot + tail + eq + value)
            else:
                processed.append(arg)

        delete = set()
        dict_args = defaultdict(dict)
        duplicates = set()
        seen = set()
        for i, arg in enumerate(processed):
            if i in delete:
                continue
            if arg.startswith("--") and "." not in arg:
                name = arg.split("=", 1)[0]
                (duplicates if name in seen else seen).add(name)
                continue
            if arg.startswith("-") and "." in arg:
                if "=" in arg:
                    arg, value_str = arg.split("=", 1)
                    if "." not in arg:
                        continue  # the dot was in the value
                else:
                    if i + 1 >= len(processed):
                        continue
                    value_str = processed[i + 1]
                    delete.add(i + 1)
                if arg.endswith("+"):
                    arg = arg[:-1]
                    value_str = json.dumps(value_str.split(","))
                key, *keys = arg.split(".")
                try:
                    value = json.loads(value_str)
                except json.JSONDecodeError:
                    try:
                        value = human_readable_int(value_str)
                    except (ValueError, argparse.ArgumentTypeError):
                        value = value_str
                duplicates |= {"%s.%s" % (key, d) for d in _merge(dict_args[key], _nested(keys, value))}
                delete.add(i)
        processed = [a for i, a in enumerate(processed) if i not in delete]
        if duplicates:
            log("Found duplicate keys %s" % ", ".join(sorted(duplicates)),
                "argparse_utils.py:385", level="WARNING")
        for key, value in dict_args.items():
            processed += [key, json.dumps(value)]
        return super().parse_args(processed, namespace)

    def _serve_model_first(self, args):
        idx = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
        if idx is not None:
            log("With `vllm serve`, you should provide the model as a positional argument or "
                "in a config file instead of via the `--model` option. The `--model` option "
                "will be removed in a future version.", "argparse_utils.py:291", level="WARNING")
            if args[idx] == "--model":
                if idx + 1 >= len(args) or args[idx + 1].startswith("-"):
                    self.error("argument --model: expected one argument")
                tag, rest = args[idx + 1], idx + 2
            else:
                tag, rest = args[idx][len("--model="):], idx + 1
            args = ["serve", tag] + args[1:idx] + args[rest:]
        if (len(args) > 1 and args[1].startswith("-")
                and not any(re.match(r"^--config(=.+|$)", a) for a in args)
                and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args)):
            raise ValueError(
                "`model` should be provided as the first positional argument when using "
                "`vllm serve`. i.e. `vllm serve <model> --<arg> <value>`.")
        return args

    def check_port(self, value):
        try:
            value = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError("Port must be an integer") from None
        if not 1024 <= value <= 65535:
            raise argparse.ArgumentTypeError("Port must be between 1024 and 65535")
        return value
