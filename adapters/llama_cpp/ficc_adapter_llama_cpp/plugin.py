"""Registers the llama_cpp adapter with FICC (entry point ``llama_cpp``)."""

from __future__ import annotations

from ficc_core import AdapterRegistry, hookimpl

from .adapter import LlamaCppAdapter

API_VERSION = 1


@hookimpl
def ficc_register_adapters(registry: AdapterRegistry) -> None:
    """Register the llama_cpp adapter."""
    registry.add("llama_cpp", LlamaCppAdapter)
