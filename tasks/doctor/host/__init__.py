"""The speculative-decoding doctor on the host (shipped: standard library only, Python 3.9+): rules, facts, evidence, evaluation."""
