"""Measuring a running server: /metrics, bench arithmetic, repeats, the shipped workload."""
