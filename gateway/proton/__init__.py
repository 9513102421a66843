"""The proton quarantine: every reach into python-qpid-proton 0.40's private parts and C layer.

docs/design.md ("What proton 0.40 makes us do") lists each workaround here, the proton
behaviour that forces it and the upstream change that would remove it. ruff bans ``cproton``,
``cproton_ffi``, ``cffi`` and ``ctypes`` outside this package, and tests/unit/test_layering.py
rejects proton's private modules and attributes outside it.
"""
