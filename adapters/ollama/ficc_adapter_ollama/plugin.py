"""Registers the ollama adapter with FICC (entry point ``ollama``)."""

from __future__ import annotations

from ficc_core import AdapterRegistry, hookimpl

from .adapter import OllamaAdapter

API_VERSION = 1


@hookimpl
def ficc_register_adapters(registry: AdapterRegistry) -> None:
    """Register the ollama adapter."""
    registry.add("ollama", OllamaAdapter)
