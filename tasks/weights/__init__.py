"""`fab pull`: the weights a profile names, onto every host, verified (client side).

The host half is tasks/weights/host/receiver.py (shipped with the agent until the per-capability
layout moves it beside this package).
"""
