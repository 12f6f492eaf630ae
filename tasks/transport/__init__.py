"""Talking to hosts: SSH connections with strict host keys, the host agent and its code."""
