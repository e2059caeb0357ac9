"""The adapter and executor registries, and plugins registered explicitly (no entry points)."""

from __future__ import annotations

import types

import pytest

from ficc_core import AdapterRegistry, ExecutorRegistry, PluginError, hookimpl
from ficc_core.plugins import build_plugin_manager


class Adapter:
    API_VERSION = 1

    def job(self, specification, model_record, placement, immutable_input_references):
        raise NotImplementedError


class FutureAdapter(Adapter):
    API_VERSION = 2


class Provider:
    API_VERSION = 1

    def __init__(self, node_configuration):
        self.node_configuration = node_configuration


def plugin(name: str, **hooks) -> types.ModuleType:
    """A plugin module with API_VERSION 1 and the given hook implementations."""
    module = types.ModuleType(name)
    module.API_VERSION = 1
    for hook_name, function in hooks.items():
        setattr(module, hook_name, hookimpl(function))
    return module


def refusal(excinfo: pytest.ExceptionInfo[PluginError]) -> str:
    assert excinfo.value.code == "plugin_refused"
    return excinfo.value.message


def test_adapter_registry_calls_the_factory_once_and_keeps_the_adapter():
    calls = []

    def factory():
        calls.append(1)
        return Adapter()

    registry = AdapterRegistry()
    registry.add("engine", factory)
    assert isinstance(registry["engine"], Adapter)
    assert registry["engine"] is registry["engine"]
    assert calls == [1]
    assert "engine" in registry and list(registry) == ["engine"] and len(registry) == 1
    assert registry.origin("engine") is None


def test_adapter_registry_refuses_a_duplicate_name():
    registry = AdapterRegistry()
    registry.add("engine", Adapter)
    with pytest.raises(PluginError) as excinfo:
        registry.add("engine", Adapter)
    assert refusal(excinfo) == ("adapter 'engine' is already registered by a direct registration")
    [record] = registry.refusals()
    assert (record.name, record.kind, record.status) == ("engine", "adapter", "refused")
    assert (record.plugin, record.distribution) == (None, None)


def test_adapter_registry_refuses_an_adapter_with_api_version_2():
    with pytest.raises(PluginError, match="declares API_VERSION 2; this FICC supports") as excinfo:
        AdapterRegistry().add("future", FutureAdapter)
    assert excinfo.value.details["api_version"] == 2
    assert excinfo.value.details["kind"] == "adapter"


def test_adapter_registry_refuses_an_adapter_without_api_version():
    class Unversioned:
        def job(self, *args):
            raise NotImplementedError

    with pytest.raises(PluginError, match="does not declare API_VERSION"):
        AdapterRegistry().add("unversioned", Unversioned)


def test_adapter_registry_refuses_true_as_an_api_version():
    class Truthy(Adapter):
        API_VERSION = True

    with pytest.raises(PluginError, match="declares API_VERSION True"):
        AdapterRegistry().add("truthy", Truthy)


def test_adapter_registry_refuses_an_adapter_without_job():
    with pytest.raises(PluginError) as excinfo:
        AdapterRegistry().add("jobless", lambda: types.SimpleNamespace(API_VERSION=1))
    assert refusal(excinfo).endswith(
        "has no callable job(specification, model_record, placement, immutable_input_references)"
    )


def test_adapter_registry_refuses_a_job_that_is_not_callable():
    adapter = types.SimpleNamespace(API_VERSION=1, job="llama-server")
    with pytest.raises(PluginError, match="has no callable job"):
        AdapterRegistry().add("stringly", lambda: adapter)


def test_adapter_registry_refuses_a_factory_that_raises():
    def factory():
        raise ValueError("needs a GPU")

    with pytest.raises(PluginError) as excinfo:
        AdapterRegistry().add("gpu_only", factory)
    assert "its factory raised ValueError: needs a GPU" in refusal(excinfo)
    assert isinstance(excinfo.value.__cause__, ValueError)


def test_adapter_registry_refuses_a_factory_that_is_not_callable():
    with pytest.raises(PluginError, match="is not callable"):
        AdapterRegistry().add("instance", Adapter())


@pytest.mark.parametrize("name", ["", "has space", "-leading-dash", "x" * 65, 7])
def test_adapter_registry_refuses_invalid_names(name):
    with pytest.raises(PluginError, match="is not a valid name"):
        AdapterRegistry().add(name, Adapter)


def test_executor_registry_keeps_the_provider_class_without_instantiating_it():
    registry = ExecutorRegistry()
    registry.add("local", Provider)
    assert registry["local"] is Provider


def test_executor_registry_refuses_a_provider_instance():
    with pytest.raises(PluginError, match="is not a class"):
        ExecutorRegistry().add("local", Provider({}))


def test_executor_registry_refuses_a_provider_with_api_version_2():
    class FutureProvider(Provider):
        API_VERSION = 2

    with pytest.raises(PluginError) as excinfo:
        ExecutorRegistry().add("future", FutureProvider)
    assert refusal(excinfo) == (
        "executor provider 'future' declares API_VERSION 2; this FICC supports API_VERSION 1"
    )


def test_executor_registry_refuses_a_duplicate_name():
    registry = ExecutorRegistry()
    registry.add("local", Provider)
    with pytest.raises(PluginError, match="is already registered"):
        registry.add("local", Provider)


def test_a_plugin_may_register_adapters_and_providers_together():
    def ficc_register_adapters(registry):
        registry.add("both_engine", Adapter)

    def ficc_register_executor_providers(registry):
        registry.add("both_executor", Provider)

    both = plugin(
        "both",
        ficc_register_adapters=ficc_register_adapters,
        ficc_register_executor_providers=ficc_register_executor_providers,
    )
    plugin_set = build_plugin_manager(autoload=False, extra_plugins=[both])
    assert [(r.name, r.kind, r.status) for r in plugin_set.report] == [
        ("both_engine", "adapter", "loaded"),
        ("both_executor", "executor", "loaded"),
    ]
    assert plugin_set.adapters.origin("both_engine").plugin == "both"


def test_a_plugin_that_registers_nothing_is_reported_as_a_loaded_plugin():
    plugin_set = build_plugin_manager(autoload=False, extra_plugins=[plugin("quiet")])
    [record] = plugin_set.report
    assert (record.name, record.kind, record.status, record.api_version) == (
        "quiet",
        "plugin",
        "loaded",
        1,
    )


def test_a_refusal_the_plugin_catches_is_still_reported():
    def ficc_register_adapters(registry):
        registry.add("fine", Adapter)
        try:
            registry.add("future", FutureAdapter)
        except PluginError:
            pass  # carry on without it

    careful = plugin("careful", ficc_register_adapters=ficc_register_adapters)
    plugin_set = build_plugin_manager(autoload=False, extra_plugins=[careful])
    assert [(r.name, r.kind, r.status) for r in plugin_set.report] == [
        ("fine", "adapter", "loaded"),
        ("future", "adapter", "refused"),
    ]
    assert plugin_set.report[1].api_version == 2
    assert list(plugin_set.adapters) == ["fine"]


def test_a_refused_plugin_does_not_stop_the_next_one():
    def failing(registry):
        registry.add("duplicate", Adapter)
        registry.add("duplicate", Adapter)

    def working(registry):
        registry.add("duplicate", Adapter)

    plugin_set = build_plugin_manager(
        autoload=False,
        extra_plugins=[
            plugin("failing", ficc_register_adapters=failing),
            plugin("working", ficc_register_adapters=working),
        ],
    )
    assert [(r.name, r.status) for r in plugin_set.report] == [
        ("failing", "refused"),
        ("duplicate", "loaded"),
    ]
    assert plugin_set.report[0].reason == (
        "plugin 'failing' (registered directly, not from a distribution) registers adapter "
        "'duplicate', which is already registered by plugin 'failing' (registered directly, "
        "not from a distribution)"
    )
    assert plugin_set.adapters.origin("duplicate").plugin == "working"


def test_a_hook_implementation_with_unknown_arguments_is_refused():
    def ficc_register_adapters(registri):
        pass

    typo = plugin("typo", ficc_register_adapters=ficc_register_adapters)
    plugin_set = build_plugin_manager(autoload=False, extra_plugins=[typo])
    [record] = plugin_set.report
    assert record.status == "refused"
    assert record.reason.startswith(
        "plugin 'typo' (registered directly, not from a distribution) has an invalid hook "
        "implementation"
    )
    assert "registri" in record.reason


def test_an_unspecified_hook_refuses_only_its_plugin():
    def ficc_register_engines(registry):
        pass

    def ficc_register_adapters(registry):
        registry.add("kept", Adapter)

    plugin_set = build_plugin_manager(
        autoload=False,
        extra_plugins=[
            plugin("unknown", ficc_register_engines=ficc_register_engines),
            plugin("known", ficc_register_adapters=ficc_register_adapters),
        ],
    )
    assert [(r.name, r.status) for r in plugin_set.report] == [
        ("unknown", "refused"),
        ("kept", "loaded"),
    ]
    assert "ficc_register_engines" in plugin_set.report[0].reason
    assert "ficc_register_adapters, ficc_register_executor_providers" in (
        plugin_set.report[0].reason
    )


def test_the_same_plugin_object_twice_is_refused_the_second_time():
    once = plugin("once")
    plugin_set = build_plugin_manager(autoload=False, extra_plugins=[once, once])
    assert [r.status for r in plugin_set.report] == ["loaded", "refused"]
    assert "has the same name as plugin 'once'" in plugin_set.report[1].reason
