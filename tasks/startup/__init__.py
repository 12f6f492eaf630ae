"""Start-up phases: read from the engine's log on the host, estimated and worded on the client."""
