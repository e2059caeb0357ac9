"""Registers the container executor provider with FICC (entry point ``container``)."""

from __future__ import annotations

from ficc_core import ExecutorRegistry, hookimpl

from .provider import ContainerProvider

API_VERSION = 1


@hookimpl
def ficc_register_executor_providers(registry: ExecutorRegistry) -> None:
    """Register the container executor provider class."""
    registry.add("container", ContainerProvider)
