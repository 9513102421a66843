"""The benchmark scenarios, by name (``python -m bench NAME --help`` for each one's options)."""
