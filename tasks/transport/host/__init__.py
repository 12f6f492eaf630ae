"""The host agent (shipped: standard library only, Python 3.9+): its loop, the ops table, op put_file.

Every host/ package under tasks/ travels with this one as the package llmfab_host
(tasks/transport/agent_code.py)."""
