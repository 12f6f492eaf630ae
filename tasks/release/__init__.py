"""One release on a host: its launcher (client) and its directory, history and launch (host)."""
