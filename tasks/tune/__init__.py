"""`fab tune`: find the fastest speculative-decoding setting by measuring each one.

    task.py        the task's body: checks, host survey, the sweep, the decision, put back
    variants.py    --vary / --profiles / --baseline -> variant profile files (and tuned.toml)
    hosts.py       the hosts alike or refused; each put back at the end (or Ctrl-C)
    sweep.py       the hosts share the variants: deploy, bench, stop, one at a time each
    results.py     results.jsonl records, resume, the winner and the table (pure)
    htmlreport.py  report.html: inline SVG charts, the table, the winner and why (pure)

It reuses, never re-implements: deploy (tasks/deploy.py deploy_host), bench
(tasks/bench.py measure_once, tasks/measure/host/loadgen.py), the doctor's verdict, stop and
rollback (tasks/releases.py rollback_host), and the shipped prompts (tasks/measure/workload.py).
"""
