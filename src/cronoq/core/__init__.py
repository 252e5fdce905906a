"""Engine core: sans-I/O, deterministic; see engine.py for the theory of operation."""
