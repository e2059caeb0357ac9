"""The ``ficc`` command line: one ``click`` group and a module per command family."""

from .main import main

__all__ = ["main"]
