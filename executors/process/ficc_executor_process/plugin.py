"""Registers the process executor provider with FICC (entry point ``process``)."""

from __future__ import annotations

from ficc_core import ExecutorRegistry, hookimpl

from .provider import ProcessProvider

API_VERSION = 1


@hookimpl
def ficc_register_executor_providers(registry: ExecutorRegistry) -> None:
    """Register the process executor provider class."""
    registry.add("process", ProcessProvider)
