"""The floor every other package of tasks/ stands on: it imports none of them.

Its host half, tasks/base/host/, holds what the host modules share: errors and their words,
state files (read_json, atomic writes), a deployment directory's layout (releases/, current,
server.json, a release's exit and stop records), reading /proc, which processes are a deployment's
(process identity), stopping processes, the engine's identity, and the one reader of a start's
server.log (startlog.py)."""
