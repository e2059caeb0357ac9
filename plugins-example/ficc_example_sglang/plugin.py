"""Registers the sglang adapter with FICC (entry point ``sglang`` in ``ficc.inference``)."""

from __future__ import annotations

from ficc_core import AdapterRegistry, hookimpl

from .adapter import SGLangAdapter

API_VERSION = 1


@hookimpl
def ficc_register_adapters(registry: AdapterRegistry) -> None:
    """Register the sglang adapter."""
    registry.add("sglang", SGLangAdapter)
