"""The installed ficc-executor-container distribution is discovered and registers its provider."""

from importlib import metadata

from ficc_executor_container.provider import ContainerProvider

from ficc_core import API_VERSION
from ficc_core.plugins import build_plugin_manager


def test_container_provider_is_discovered_through_its_entry_point():
    plugin_set = build_plugin_manager(autoload=True)
    [record] = [r for r in plugin_set.report if r.name == "container" and r.kind == "executor"]
    assert record.status == "loaded", record.reason
    assert record.distribution == "ficc-executor-container"
    assert record.version == metadata.version("ficc-executor-container") == "0.1.0"
    assert record.api_version == API_VERSION == 1
    assert plugin_set.executors["container"] is ContainerProvider


def test_container_provider_class_declares_the_plugin_api():
    assert ContainerProvider.API_VERSION == 1
    assert ContainerProvider.name == "container"
