"""The installed ficc-adapter-ollama distribution is discovered and registers its adapter."""

from importlib import metadata

from ficc_adapter_ollama.adapter import OllamaAdapter

from ficc_core import API_VERSION
from ficc_core.plugins import build_plugin_manager


def test_ollama_adapter_is_discovered_through_its_entry_point():
    plugin_set = build_plugin_manager(autoload=True)
    [record] = [r for r in plugin_set.report if r.name == "ollama" and r.kind == "adapter"]
    assert record.status == "loaded", record.reason
    assert record.distribution == "ficc-adapter-ollama"
    assert record.version == metadata.version("ficc-adapter-ollama") == "0.1.0"
    assert record.api_version == API_VERSION == 1
    assert isinstance(plugin_set.adapters["ollama"], OllamaAdapter)


def test_ollama_adapter_declares_the_plugin_api():
    adapter = build_plugin_manager(autoload=True).adapters["ollama"]
    assert adapter.API_VERSION == 1
    assert adapter.name == "ollama"
