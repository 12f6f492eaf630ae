"""Supervised releases: the supervisor that restarts a server on the host, and what status says of it."""
