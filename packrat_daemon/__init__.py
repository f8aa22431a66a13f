"""Packrat: serve a PyTorch model on a multi-core CPU at minimum latency, tuned by itself.

Importing this package is cheap on purpose: torch is imported only by the worker side
(`workers.runtimes`), never by the client, the solver or the CLI's `solve` command.
"""

__version__ = "0.1.0"
