"""The prompts `fab bench` and `fab tune` send when the user gives none: a shipped set, in a
seeded order, so two runs (two variants of a sweep) send exactly the same requests.

    prompts = workload.prompts(seed=0, count=33)            # [{"prompt": str}, ...]
    prompts = workload.prompts(seed=0, count=33, input_len=512)

The set (workload.jsonl beside this file, shipped in the package) is text a drafter can
predict in part: each prompt asks to repeat, copy, reformat or continue text it holds (code,
JSON, tables, logs, lists), as real editing and extraction requests do. Random tokens
would make speculative acceptance meaningless (no drafter predicts noise), so a sweep
over drafters measured on them would say nothing.

`input_len` (a number of words, roughly tokens) lengthens each prompt with further
passages of the set, in the same seeded order, and cuts it there.
"""
import json
import random
from pathlib import Path

PROMPTS_FILE = Path(__file__).with_name("workload.jsonl")


def shipped():
    """The shipped prompt texts, in file order."""
    with open(PROMPTS_FILE, encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


def prompts(seed=0, count=None, input_len=None):
    """`count` prompt items (default: the whole set once) in the order `seed` gives."""
    texts = shipped()
    rng = random.Random(seed)
    order = list(range(len(texts)))
    rng.shuffle(order)
    count = len(texts) if count is None else count
    picked = [texts[order[i % len(order)]] for i in range(count)]
    if input_len:
        picked = [_sized(text, i, texts, order, input_len) for i, text in enumerate(picked)]
    return [{"prompt": p} for p in picked]


def _sized(text, i, texts, order, words):
    """`text` with the set's next passages appended until it holds `words` words, cut there."""
    parts, n = [text], len(text.split())
    j = i + 1
    while n < words:
        more = texts[order[j % len(order)]]
        parts.append(more)
        n += len(more.split())
        j += 1
    joined = "\n\n".join(parts)
    return joined if len(joined.split()) <= words else " ".join(joined.split()[:words])
