"""Plugin discovery through real entry points: the built-ins load, broken plugins are refused.

The misbehaving plugins here are real installed-looking distributions: a
``*.dist-info`` directory (METADATA, entry_points.txt) and a module, in a
directory put on ``sys.path`` (or on ``PYTHONPATH`` of a subprocess), exactly what
``importlib.metadata`` finds for a pip-installed package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from ficc_core.plugins import (
    DISABLE_AUTOLOAD_ENV,
    PluginRecord,
    PluginSet,
    build_plugin_manager,
)

BUILTINS = {
    ("llama_cpp", "adapter", "ficc-adapter-llama-cpp"),
    ("ollama", "adapter", "ficc-adapter-ollama"),
    ("vllm", "adapter", "ficc-adapter-vllm"),
    ("process", "executor", "ficc-executor-process"),
    ("container", "executor", "ficc-executor-container"),
    ("llama_server", "runtime", "ficc-llama-server"),
}
#: Installed on a node on its own (an engine runtime): it does not depend on ficc-core.
STANDALONE = {"ficc-llama-server"}

FUTURE_PLUGIN = """
    from ficc_core import hookimpl

    API_VERSION = 2

    @hookimpl
    def ficc_register_adapters(registry):
        registry.add("future", object)
"""

BROKEN_PLUGIN = """
    raise RuntimeError("this plugin cannot be imported")
"""

FUTURE_REASON = (
    "plugin 'future' from distribution 'ficc-example-future 1.0' declares API_VERSION 2; "
    "this FICC supports API_VERSION 1"
)


class FakeSite:
    """A directory of installed-looking distributions, on ``sys.path`` for one test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[str] = []

    def install(self, distribution: str, entry_points: dict[str, str], **modules: str) -> None:
        """Write ``<distribution>-1.0.dist-info`` and the given top-level modules."""
        dist_info = self.root / f"{distribution.replace('-', '_')}-1.0.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n"
        )
        lines = ["[ficc.inference]", *(f"{n} = {t}" for n, t in entry_points.items())]
        (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        for module, source in modules.items():
            (self.root / f"{module}.py").write_text(textwrap.dedent(source))
            self.modules.append(module)

    def install_future_and_broken(self) -> None:
        self.install(
            "ficc-example-future",
            {"future": "ficc_example_future"},
            ficc_example_future=FUTURE_PLUGIN,
        )
        self.install(
            "ficc-example-broken",
            {"broken": "ficc_example_broken"},
            ficc_example_broken=BROKEN_PLUGIN,
        )


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    root = tmp_path / "site-packages"
    root.mkdir()
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    monkeypatch.syspath_prepend(str(root))
    fake = FakeSite(root)
    yield fake
    for module in fake.modules:
        sys.modules.pop(module, None)


def by_name(plugin_set: PluginSet, name: str) -> PluginRecord:
    [record] = [record for record in plugin_set.report if record.name == name]
    return record


def assert_builtins_loaded(plugin_set: PluginSet) -> None:
    loaded = {(r.name, r.kind, r.distribution) for r in plugin_set.report if r.status == "loaded"}
    assert BUILTINS <= loaded
    assert {"llama_cpp", "ollama", "vllm"} <= set(plugin_set.adapters)
    assert {"process", "container"} <= set(plugin_set.executors)
    assert "llama_server" in plugin_set.runtimes


def test_the_builtin_plugins_are_discovered_through_their_entry_points(monkeypatch):
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    plugin_set = build_plugin_manager()
    assert plugin_set.autoload
    assert_builtins_loaded(plugin_set)
    assert plugin_set.refused == ()
    for name, _kind, distribution in BUILTINS:
        record = by_name(plugin_set, name)
        assert (record.plugin, record.version, record.api_version) == (name, "0.1.0", 1)
        assert record.distribution == distribution
        assert plugin_set.manager.get_plugin(name) is not None


def test_builtin_distributions_move_in_lockstep_with_ficc_core():
    core = metadata.version("ficc-core")
    for _name, _kind, distribution in BUILTINS:
        assert metadata.version(distribution) == core
        requirement = metadata.requires(distribution)
        if distribution in STANDALONE:
            assert not any(item.startswith("ficc-core") for item in requirement)
            continue
        assert requirement == ["ficc-core<0.2,>=0.1"] or requirement == ["ficc-core>=0.1,<0.2"]


def test_every_build_makes_a_fresh_plugin_manager():
    first, second = build_plugin_manager(autoload=True), build_plugin_manager(autoload=True)
    assert first.manager is not second.manager
    assert first.adapters["vllm"] is not second.adapters["vllm"]


def test_plugin_declaring_api_version_2_is_refused_naming_its_distribution(site):
    site.install(
        "ficc-example-future", {"future": "ficc_example_future"}, ficc_example_future=FUTURE_PLUGIN
    )
    plugin_set = build_plugin_manager()
    record = by_name(plugin_set, "future")
    assert record == PluginRecord(
        name="future",
        kind="plugin",
        plugin="future",
        distribution="ficc-example-future",
        version="1.0",
        api_version=2,
        status="refused",
        reason=FUTURE_REASON,
    )
    assert plugin_set.manager.get_plugin("future") is None
    assert "future" not in plugin_set.adapters


def test_plugin_whose_import_fails_is_refused_naming_its_distribution(site):
    site.install(
        "ficc-example-broken", {"broken": "ficc_example_broken"}, ficc_example_broken=BROKEN_PLUGIN
    )
    record = by_name(build_plugin_manager(), "broken")
    assert (record.kind, record.status, record.api_version) == ("plugin", "refused", None)
    assert (record.distribution, record.version) == ("ficc-example-broken", "1.0")
    assert record.reason == (
        "plugin 'broken' from distribution 'ficc-example-broken 1.0' could not be imported "
        "(ficc_example_broken): RuntimeError: this plugin cannot be imported"
    )


def test_refused_plugins_leave_the_builtins_working(site):
    site.install_future_and_broken()
    plugin_set = build_plugin_manager()
    assert {record.name for record in plugin_set.refused} == {"future", "broken"}
    assert all("ficc-example-" in record.reason for record in plugin_set.refused)
    assert_builtins_loaded(plugin_set)


def test_plugin_without_api_version_is_refused(site):
    site.install(
        "ficc-example-unversioned",
        {"unversioned": "ficc_example_unversioned"},
        ficc_example_unversioned="from ficc_core import hookimpl\n",
    )
    record = by_name(build_plugin_manager(), "unversioned")
    assert record.status == "refused"
    assert record.reason == (
        "plugin 'unversioned' from distribution 'ficc-example-unversioned 1.0' does not declare "
        "API_VERSION; this FICC supports API_VERSION 1"
    )


def test_plugin_declaring_api_version_as_a_string_is_refused(site):
    site.install(
        "ficc-example-stringly",
        {"stringly": "ficc_example_stringly"},
        ficc_example_stringly=("API_VERSION = '1'\n"),
    )
    record = by_name(build_plugin_manager(), "stringly")
    assert (record.status, record.api_version) == ("refused", None)
    assert "declares API_VERSION '1'; this FICC supports API_VERSION 1" in record.reason


def test_plugin_implementing_an_unspecified_hook_is_refused_by_check_pending(site):
    site.install(
        "ficc-example-unknown-hook",
        {"unknown_hook": "ficc_example_unknown_hook"},
        ficc_example_unknown_hook="""
            from ficc_core import hookimpl

            API_VERSION = 1

            @hookimpl
            def ficc_register_engines(registry):
                pass
        """,
    )
    plugin_set = build_plugin_manager()
    record = by_name(plugin_set, "unknown_hook")
    assert record.status == "refused"
    assert record.reason.startswith(
        "plugin 'unknown_hook' from distribution 'ficc-example-unknown-hook 1.0' implements "
        "ficc_register_engines, which API_VERSION 1 does not specify"
    )
    assert plugin_set.manager.get_plugin("unknown_hook") is None
    plugin_set.manager.check_pending()  # what is left is consistent
    assert_builtins_loaded(plugin_set)


def test_exception_in_a_registration_hook_is_attributed_to_its_plugin(site):
    site.install(
        "ficc-example-crash",
        {"crash": "ficc_example_crash"},
        ficc_example_crash="""
            from ficc_core import hookimpl

            API_VERSION = 1

            class Adapter:
                API_VERSION = 1

                def job(self, specification, model_record, placement, references):
                    raise NotImplementedError

            @hookimpl
            def ficc_register_adapters(registry):
                registry.add("crash_first", Adapter)
                raise RuntimeError("kaput")
        """,
    )
    plugin_set = build_plugin_manager()
    record = by_name(plugin_set, "crash")
    assert (record.kind, record.status) == ("plugin", "refused")
    assert record.reason == (
        "plugin 'crash' from distribution 'ficc-example-crash 1.0' failed in "
        "ficc_register_adapters: RuntimeError: kaput"
    )
    # All or nothing: what it registered before failing is gone too.
    assert "crash_first" not in plugin_set.adapters
    assert plugin_set.manager.get_plugin("crash") is None
    assert_builtins_loaded(plugin_set)


def test_exception_in_the_executor_registration_hook_is_attributed_to_its_plugin(site):
    site.install(
        "ficc-example-crash-executor",
        {"crash_executor": "ficc_example_crash_executor"},
        ficc_example_crash_executor="""
            from ficc_core import hookimpl

            API_VERSION = 1

            @hookimpl
            def ficc_register_executor_providers(registry):
                raise OSError("no such runtime")
        """,
    )
    record = by_name(build_plugin_manager(), "crash_executor")
    assert record.reason == (
        "plugin 'crash_executor' from distribution 'ficc-example-crash-executor 1.0' failed in "
        "ficc_register_executor_providers: OSError: no such runtime"
    )


def test_adapter_with_api_version_2_refuses_its_plugin_naming_the_distribution(site):
    site.install(
        "ficc-example-old-adapter",
        {"old_adapter": "ficc_example_old_adapter"},
        ficc_example_old_adapter="""
            from ficc_core import hookimpl

            API_VERSION = 1

            class Adapter:
                API_VERSION = 2

                def job(self, specification, model_record, placement, references):
                    raise NotImplementedError

            @hookimpl
            def ficc_register_adapters(registry):
                registry.add("old", Adapter)
        """,
    )
    plugin_set = build_plugin_manager()
    record = by_name(plugin_set, "old_adapter")
    assert (record.kind, record.status) == ("plugin", "refused")
    assert record.reason == (
        "plugin 'old_adapter' from distribution 'ficc-example-old-adapter 1.0' registers "
        "adapter 'old', which declares API_VERSION 2; this FICC supports API_VERSION 1"
    )
    assert "old" not in plugin_set.adapters


def test_adapter_name_taken_by_a_builtin_refuses_the_newcomer(site):
    site.install(
        "ficc-example-impostor",
        {"impostor": "ficc_example_impostor"},
        ficc_example_impostor="""
            from ficc_core import hookimpl

            API_VERSION = 1

            class Adapter:
                API_VERSION = 1

                def job(self, specification, model_record, placement, references):
                    raise NotImplementedError

            @hookimpl
            def ficc_register_adapters(registry):
                registry.add("llama_cpp", Adapter)
        """,
    )
    plugin_set = build_plugin_manager()
    assert by_name(plugin_set, "impostor").reason == (
        "plugin 'impostor' from distribution 'ficc-example-impostor 1.0' registers adapter "
        "'llama_cpp', which is already registered by plugin 'llama_cpp' from distribution "
        "'ficc-adapter-llama-cpp 0.1.0'"
    )
    assert plugin_set.adapters.origin("llama_cpp").distribution == "ficc-adapter-llama-cpp"


def test_entry_point_named_like_a_builtin_is_refused_and_the_builtin_kept(site):
    site.install(
        "ficc-example-shadow",
        {"vllm": "ficc_example_shadow"},
        ficc_example_shadow="API_VERSION = 1\n",
    )
    plugin_set = build_plugin_manager()
    [shadow] = [r for r in plugin_set.refused if r.distribution == "ficc-example-shadow"]
    assert shadow.reason == (
        "plugin 'vllm' from distribution 'ficc-example-shadow 1.0' has the same name as "
        "plugin 'vllm' from distribution 'ficc-adapter-vllm 0.1.0', which was loaded first"
    )
    assert_builtins_loaded(plugin_set)


def test_environment_switch_turns_entry_point_autoloading_off(site, monkeypatch):
    site.install_future_and_broken()
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    plugin_set = build_plugin_manager()
    assert not plugin_set.autoload
    assert plugin_set.report == ()
    assert len(plugin_set.adapters) == len(plugin_set.executors) == 0
    assert plugin_set.manager.get_plugins() == set()


def test_explicit_plugins_register_while_autoloading_is_off(site, monkeypatch):
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "yes")
    from ficc_adapter_ollama import plugin as ollama_plugin

    plugin_set = build_plugin_manager(extra_plugins=[ollama_plugin])
    assert list(plugin_set.adapters) == ["ollama"]
    record = by_name(plugin_set, "ollama")
    assert (record.plugin, record.distribution) == ("ficc_adapter_ollama.plugin", None)


def test_autoload_argument_wins_over_the_environment(site, monkeypatch):
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    assert_builtins_loaded(build_plugin_manager(autoload=True))
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV)
    assert build_plugin_manager(autoload=False).report == ()


def test_an_empty_environment_switch_leaves_autoloading_on(site, monkeypatch):
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "")
    assert build_plugin_manager().autoload


def run_plugins_command(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "from ficc_core.cli.plugins import plugins_command; plugins_command()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (DISABLE_AUTOLOAD_ENV, "PYTHONPATH")}
    env.update(extra)
    return env


def test_ficc_plugins_reports_refused_plugins_and_exits_zero(site):
    site.install_future_and_broken()
    result = run_plugins_command(env=subprocess_env(PYTHONPATH=str(site.root)))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "DISTRIBUTION", "VERSION", "API", "STATUS"]
    # The plugin table ends at the first empty line (the runtimes' table follows).
    rows = {line.split()[0]: line for line in lines[1 : lines.index("")]}
    for name, kind, distribution in BUILTINS:
        assert rows[name].split()[1:6] == [kind, distribution, "0.1.0", "1", "loaded"]
    assert rows["future"].split()[1:5] == ["plugin", "ficc-example-future", "1.0", "2"]
    assert rows["future"].endswith(f"refused: {FUTURE_REASON}")
    assert rows["broken"].split()[1:5] == ["plugin", "ficc-example-broken", "1.0", "-"]
    assert "refused: plugin 'broken' from distribution 'ficc-example-broken 1.0'" in rows["broken"]


def test_ficc_plugins_json_reports_refusals(site):
    site.install_future_and_broken()
    result = run_plugins_command("--json", env=subprocess_env(PYTHONPATH=str(site.root)))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["autoload"] is True
    refused = {p["name"]: p for p in report["plugins"] if p["status"] == "refused"}
    assert set(refused) == {"future", "broken"}
    assert refused["future"]["reason"] == FUTURE_REASON
    assert refused["broken"]["distribution"] == "ficc-example-broken"


def test_ficc_plugins_honours_the_environment_switch(site):
    site.install_future_and_broken()
    env = subprocess_env(PYTHONPATH=str(site.root), **{DISABLE_AUTOLOAD_ENV: "1"})
    result = run_plugins_command(env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "No plugins found.",
        "",
        f"Entry-point autoloading is off: {DISABLE_AUTOLOAD_ENV} is set.",
    ]


def test_ficc_console_script_reports_refusals(site):
    ficc = Path(sys.executable).with_name("ficc")
    if not ficc.exists():
        pytest.skip("the ficc console script is not installed in this environment")
    site.install_future_and_broken()
    result = subprocess.run(
        [str(ficc), "plugins"],
        env=subprocess_env(PYTHONPATH=str(site.root)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"refused: {FUTURE_REASON}" in result.stdout
    assert ["llama_cpp", "adapter"] in [line.split()[:2] for line in result.stdout.splitlines()]
