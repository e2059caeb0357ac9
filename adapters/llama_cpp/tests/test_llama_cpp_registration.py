"""The installed ficc-adapter-llama-cpp distribution is discovered and registers its adapter."""

from importlib import metadata

from ficc_adapter_llama_cpp.adapter import LlamaCppAdapter

from ficc_core import API_VERSION
from ficc_core.plugins import build_plugin_manager


def test_llama_cpp_adapter_is_discovered_through_its_entry_point():
    plugin_set = build_plugin_manager(autoload=True)
    [record] = [r for r in plugin_set.report if r.name == "llama_cpp" and r.kind == "adapter"]
    assert record.status == "loaded", record.reason
    assert record.distribution == "ficc-adapter-llama-cpp"
    assert record.version == metadata.version("ficc-adapter-llama-cpp") == "0.1.0"
    assert record.api_version == API_VERSION == 1
    assert isinstance(plugin_set.adapters["llama_cpp"], LlamaCppAdapter)


def test_llama_cpp_adapter_declares_the_plugin_api():
    adapter = build_plugin_manager(autoload=True).adapters["llama_cpp"]
    assert adapter.API_VERSION == 1
    assert adapter.name == "llama_cpp"
