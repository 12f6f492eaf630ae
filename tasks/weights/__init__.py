"""`fab pull`: the weights a profile names, onto every host, verified (client side).

The host half is tasks/weights/host/receiver.py, shipped with the agent; a pull copies it into
place as the receiver its per-pull key may run.
"""
