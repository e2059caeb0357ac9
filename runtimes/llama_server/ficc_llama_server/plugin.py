"""Declares the ``llama_server`` runtime to FICC (entry point ``llama_server``).

Only FICC loads this module, through its ``ficc.inference`` entry point, so this
distribution still runs on its own without ``ficc-core``. The runtime is the
``ficc-llama-server`` console script this distribution installed beside the
Python that runs FICC; the node agent hashes it and advertises that digest.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from ficc_core import RuntimeRegistry, hookimpl

from .cli import PROG

API_VERSION = 1

#: The runtime's name in a node snapshot.
RUNTIME = "llama_server"


def executable() -> Path:
    """Where the installer put the ``ficc-llama-server`` script: this environment's scripts."""
    return Path(sysconfig.get_path("scripts")).absolute() / PROG


@hookimpl
def ficc_register_runtimes(registry: RuntimeRegistry) -> None:
    """Declare llama_server: llama.cpp's server for the llama_cpp adapter, run as a process.

    It runs on CPUs (a GPU build offloads layers when a placement reserves a GPU), so
    it does not require a GPU and suggests no GPU memory.
    """
    registry.add(
        RUNTIME,
        provider="process",
        executable=executable(),
        engines=["llama_cpp"],
        isolation="process",
        network="none",
        requires_gpu=False,
    )
