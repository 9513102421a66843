"""sluicegate: an AMQP 1.0 message server whose flow control keeps memory bounded.

The project's top-level folders are this namespace's packages (``sluicegate.gateway``,
``sluicegate.session``, ...); this folder links them in, so the installed package, an editable
install, mypy and a checkout all see one import path (docs/design.md, "Packages").
"""
