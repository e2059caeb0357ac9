"""The installed ficc-executor-process distribution is discovered and registers its provider."""

from importlib import metadata

from ficc_executor_process.provider import ProcessProvider

from ficc_core import API_VERSION
from ficc_core.plugins import build_plugin_manager


def test_process_provider_is_discovered_through_its_entry_point():
    plugin_set = build_plugin_manager(autoload=True)
    [record] = [r for r in plugin_set.report if r.name == "process" and r.kind == "executor"]
    assert record.status == "loaded", record.reason
    assert record.distribution == "ficc-executor-process"
    assert record.version == metadata.version("ficc-executor-process") == "0.1.0"
    assert record.api_version == API_VERSION == 1
    assert plugin_set.executors["process"] is ProcessProvider


def test_process_provider_class_declares_the_plugin_api():
    assert ProcessProvider.API_VERSION == 1
    assert ProcessProvider.name == "process"
