"""The installed ficc-adapter-vllm distribution is discovered and registers its adapter."""

from importlib import metadata

from ficc_adapter_vllm.adapter import VllmAdapter

from ficc_core import API_VERSION
from ficc_core.plugins import build_plugin_manager


def test_vllm_adapter_is_discovered_through_its_entry_point():
    plugin_set = build_plugin_manager(autoload=True)
    [record] = [r for r in plugin_set.report if r.name == "vllm" and r.kind == "adapter"]
    assert record.status == "loaded", record.reason
    assert record.distribution == "ficc-adapter-vllm"
    assert record.version == metadata.version("ficc-adapter-vllm") == "0.1.0"
    assert record.api_version == API_VERSION == 1
    assert isinstance(plugin_set.adapters["vllm"], VllmAdapter)


def test_vllm_adapter_declares_the_plugin_api():
    adapter = build_plugin_manager(autoload=True).adapters["vllm"]
    assert adapter.API_VERSION == 1
    assert adapter.name == "vllm"
