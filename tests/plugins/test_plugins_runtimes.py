"""Runtimes are plugins too: an installed runtime distribution declares its runtimes, and a
node advertises them with the digest it computed, without any agent settings."""

from __future__ import annotations

import json
import shutil
import signal
import sysconfig
import tempfile
import types
from pathlib import Path

import httpx
import pytest
import trio
from click.testing import CliRunner

from ficc_core import PluginError, RuntimeRegistry, hookimpl
from ficc_core.agent import Agent, AgentSettings, DeclaredRuntime, check_runtime
from ficc_core.agent.embedded import agent_from_config
from ficc_core.base.digests import file_digest
from ficc_core.cli.plugins import plugins_command
from ficc_core.config import load_config
from ficc_core.plugins import DISABLE_AUTOLOAD_ENV, build_plugin_manager

from ..support.serve_support import ServeProcess
from .test_plugins_registry import plugin

#: Where `pip install runtimes/llama_server` put the console script of this environment.
EXECUTABLE = Path(sysconfig.get_path("scripts")).absolute() / "ficc-llama-server"
PROCESS = "sha256:" + "a" * 64


@pytest.fixture
def agent_dir():
    path = tempfile.mkdtemp(prefix="fr-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _declare(**overrides):
    """A ficc_register_runtimes implementation declaring one runtime ``r``."""
    options = {
        "provider": "process",
        "executable": "/opt/engine/bin/serve",
        "engines": ["my_engine"],
        "isolation": "process",
        **overrides,
    }

    def ficc_register_runtimes(registry):
        registry.add(options.pop("name", "r"), **options)

    return ficc_register_runtimes


# -- the hook, through pluggy's validation ------------------------------------------------


def test_a_plugin_declares_a_runtime_through_the_hook():
    declaring = plugin("declaring", ficc_register_runtimes=_declare())
    plugin_set = build_plugin_manager(autoload=False, extra_plugins=[declaring])
    assert plugin_set.refused == ()
    assert plugin_set.runtimes["r"] == DeclaredRuntime(
        name="r",
        provider="process",
        executable=Path("/opt/engine/bin/serve"),
        engines=("my_engine",),
        isolation="process",
        network="none",
    )
    [record] = plugin_set.report
    assert (record.name, record.kind, record.plugin, record.status) == (
        "r",
        "runtime",
        "declaring",
        "loaded",
    )
    # The hook has a specification: pluggy validated the implementation against it.
    assert plugin_set.manager.hook.ficc_register_runtimes.spec is not None


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"executable": "bin/serve"}, "which is not an absolute path"),
        ({"engines": []}, "names no engine"),
        ({"engines": "my_engine"}, "give a list of engine names"),
        ({"engines": ["My Engine"]}, "has engines 'My Engine', which is not an identifier"),
        ({"provider": ""}, "has provider '', which is not an identifier"),
        ({"network": "Host"}, "has network 'Host', which is not an identifier"),
        ({"name": "Bad Name"}, "is not a valid name"),
        ({"name": "Upper"}, "is not an identifier"),
    ],
)
def test_a_bad_declaration_refuses_the_whole_plugin_naming_it(overrides, problem):
    def ficc_register_adapters(registry):
        registry.add("my_engine", _Adapter)

    bad = plugin(
        "bad",
        ficc_register_adapters=ficc_register_adapters,
        ficc_register_runtimes=_declare(**overrides),
    )
    plugin_set = build_plugin_manager(autoload=False, extra_plugins=[bad])
    [record] = plugin_set.report
    assert (record.kind, record.status) == ("plugin", "refused")
    assert record.reason.startswith("plugin 'bad' (registered directly, not from a distribution) ")
    assert problem in record.reason
    # All or nothing: neither the runtime nor the adapter it registered is kept.
    assert len(plugin_set.runtimes) == 0 and "my_engine" not in plugin_set.adapters


def test_a_runtime_name_is_declared_once():
    first = plugin("first", ficc_register_runtimes=_declare())
    second = plugin("second", ficc_register_runtimes=_declare(executable="/elsewhere"))
    plugin_set = build_plugin_manager(autoload=False, extra_plugins=[first, second])
    assert plugin_set.runtimes["r"].executable == Path("/opt/engine/bin/serve")
    [refused] = plugin_set.refused
    assert refused.plugin == "second"
    assert "registers runtime 'r', which is already registered by plugin 'first'" in refused.reason


def test_an_implementation_that_does_not_match_the_spec_is_refused_by_pluggy():
    def ficc_register_runtimes(runtimes):
        pass

    record = build_plugin_manager(
        autoload=False,
        extra_plugins=[plugin("typo", ficc_register_runtimes=ficc_register_runtimes)],
    ).report[0]
    assert record.status == "refused"
    assert "has an invalid hook implementation" in record.reason


def test_the_registry_refuses_with_a_plugin_error_outside_any_plugin():
    registry = RuntimeRegistry()
    with pytest.raises(PluginError, match="not an absolute path"):
        registry.add(
            "r", provider="process", executable="serve", engines=["e"], isolation="process"
        )
    assert registry.declared() == ()


# -- the installed llama_server runtime ---------------------------------------------------


def test_the_llama_server_distribution_declares_its_console_script(monkeypatch):
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    plugin_set = build_plugin_manager()
    runtime = plugin_set.runtimes["llama_server"]
    assert (runtime.provider, runtime.engines, runtime.isolation, runtime.network) == (
        "process",
        ("llama_cpp",),
        "process",
        "none",
    )
    assert runtime.executable == EXECUTABLE and EXECUTABLE.is_file()
    # Its adapter is installed too: the engine it serves is one a specification can select.
    assert set(runtime.engines) <= set(plugin_set.adapters)


def test_ficc_plugins_lists_the_runtime_with_its_computed_digest(monkeypatch):
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    digest = file_digest(EXECUTABLE)
    result = CliRunner().invoke(plugins_command, [])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()]
    assert ["llama_server", "runtime", "ficc-llama-server", "0.1.0", "1", "loaded"] in rows
    assert ["llama_server", "llama_cpp", "process", "process", str(EXECUTABLE), digest] in rows

    result = CliRunner().invoke(plugins_command, ["--json"])
    [runtime] = [r for r in json.loads(result.output)["runtimes"] if r["name"] == "llama_server"]
    assert runtime == {
        "name": "llama_server",
        "provider": "process",
        "engines": ["llama_cpp"],
        "executable": str(EXECUTABLE),
        "isolation": "process",
        "network": "none",
        "image_digest": digest,
        "problem": None,
    }


# -- the agent: computed digests, TOML overrides -------------------------------------------


async def test_a_plugin_runtime_gets_the_digest_of_its_executable_or_a_problem(tmp_path):
    engine = tmp_path / "serve"
    engine.write_bytes(b"#!/bin/sh\nexec true\n")
    declared = DeclaredRuntime(
        name="r", provider="process", executable=engine, engines=["e"], isolation="process"
    )
    check = await check_runtime(declared, {"process": PROCESS})
    assert check.problem is None
    assert check.installed.image_digest == file_digest(engine)
    assert (check.installed.engines, check.installed.executable) == (("e",), str(engine))
    engine.unlink()
    check = await check_runtime(declared, {"process": PROCESS})
    assert check.installed is None and f"cannot read {engine}" in check.problem


def test_agent_settings_replace_an_installed_runtime_of_the_same_name():
    installed = (
        DeclaredRuntime(name="a", provider="process", executable="/a"),
        DeclaredRuntime(name="b", provider="process", executable="/b"),
    )
    own = DeclaredRuntime(name="b", provider="process", executable="/mine", image_digest=PROCESS)
    merged = AgentSettings(runtimes=(own,)).beside(installed)
    assert [(r.name, str(r.executable)) for r in merged.runtimes] == [("a", "/a"), ("b", "/mine")]


def test_an_agent_built_from_the_plugin_set_has_the_installed_runtimes(tmp_path, agent_dir):
    # `ficc executor` and the embedded agent both build their agent this way.
    config = load_config(overrides={"data_dir": str(tmp_path), "agent_dir": agent_dir}, environ={})
    agent: Agent = agent_from_config(config, build_plugin_manager(autoload=True), node_id="n")
    [runtime] = [r for r in agent.settings.runtimes if r.name == "llama_server"]
    assert runtime.executable == EXECUTABLE and runtime.image_digest is None


# -- a real `ficc serve` --------------------------------------------------------------------


async def _local_node(url: str, token: str) -> dict:
    """The embedded node, once it has reported a snapshot."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        with trio.fail_after(30):
            while True:
                response = await http.get(
                    "/api/v1/contributors/local", headers={"Authorization": f"Bearer {token}"}
                )
                if response.status_code == 200 and response.json()["snapshot"]:
                    return response.json()
                await trio.sleep(0.1)


async def _serve_snapshot(tmp_path: Path, *extra: str) -> dict:
    server = ServeProcess(tmp_path / "data", *extra)
    try:
        url = await server.wait_ready()
        node = await _local_node(url, await server.admin_token())
        server.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await trio.to_thread.run_sync(server.proc.wait) == 0
        return node["snapshot"]
    finally:
        server.kill()


@pytest.mark.deadline(60)
async def test_plain_serve_advertises_the_installed_llama_server_runtime(tmp_path, agent_dir):
    snapshot = await _serve_snapshot(tmp_path, "--agent-dir", agent_dir)
    [process] = snapshot["providers"]
    assert snapshot["runtimes"] == [
        {
            "name": "llama_server",
            "executor_provider": "process",
            "package_digest": process["package_digest"],
            "image_digest": file_digest(EXECUTABLE),
            "engines": ["llama_cpp"],
            "executable": str(EXECUTABLE),
            "isolation": "process",
            "network": "none",
        }
    ]
    assert not any(name.startswith("runtime/") for name in snapshot["labels"])


@pytest.mark.deadline(60)
async def test_an_agent_toml_runtime_of_the_same_name_overrides_the_plugins(tmp_path, agent_dir):
    engine = tmp_path / "my-llama-server"
    engine.write_bytes(b"#!/bin/sh\nexec true\n")
    digest = file_digest(engine)
    settings = tmp_path / "agent.toml"
    settings.write_text(
        '[[runtimes]]\nname = "llama_server"\nprovider = "process"\n'
        f'image_digest = "{digest}"\nexecutable = "{engine}"\n'
    )
    snapshot = await _serve_snapshot(
        tmp_path, "--agent-dir", agent_dir, "--agent-config", str(settings)
    )
    [runtime] = snapshot["runtimes"]
    assert (runtime["name"], runtime["image_digest"]) == ("llama_server", digest)
    # The operator's declaration replaces the plugin's whole: it said nothing about engines.
    assert "engines" not in runtime and runtime["executable"] == str(engine)


class _Adapter:
    API_VERSION = 1

    def job(self, specification, model_record, placement, immutable_input_references):
        raise NotImplementedError


def test_an_optional_implementation_of_a_hook_this_ficc_lacks_is_skipped_not_refused():
    # What docs/plugins.md tells a runtime plugin that must load in an older FICC too.
    def ficc_register_something_later(registry):
        raise AssertionError("never called")

    later = types.ModuleType("later")
    later.API_VERSION = 1
    later.ficc_register_something_later = hookimpl(optionalhook=True)(ficc_register_something_later)
    [record] = build_plugin_manager(autoload=False, extra_plugins=[later]).report
    assert (record.kind, record.status) == ("plugin", "loaded")
