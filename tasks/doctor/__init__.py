"""The speculative-decoding doctor, client side: host requests, live verdicts, findings."""
