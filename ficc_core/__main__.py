"""``python -m ficc_core`` is the ``ficc`` command."""

from .cli import main

main()
