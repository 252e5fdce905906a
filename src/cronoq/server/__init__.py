"""Server mode: cronoq-server, which runs the engine for remote workers (SERVER.md)."""
