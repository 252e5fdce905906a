"""Server mode: cronoq-server, which runs the engine for remote workers (docs/server.md)."""
