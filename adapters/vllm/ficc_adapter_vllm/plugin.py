"""Registers the vllm adapter with FICC (entry point ``vllm``)."""

from __future__ import annotations

from ficc_core import AdapterRegistry, hookimpl

from .adapter import VllmAdapter

API_VERSION = 1


@hookimpl
def ficc_register_adapters(registry: AdapterRegistry) -> None:
    """Register the vllm adapter."""
    registry.add("vllm", VllmAdapter)
