"""`fab pull`: the weights a profile names, onto every host, verified (client side).

The host half is tasks/hostside/weights.py (shipped with the agent until the per-capability
layout moves it beside this package).
"""
