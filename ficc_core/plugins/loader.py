"""Discover, check and register FICC plugins.

``build_plugin_manager()`` builds a fresh plugin set every time it is called (there
is no module-level manager): it loads each entry point of the group
``ficc.inference`` on its own, so a plugin that fails is refused alone, with an
error naming its distribution, and every other plugin keeps working. A plugin is
refused when:

- its import raises;
- it does not declare ``API_VERSION = 1``;
- pluggy rejects one of its hook implementations, or it implements a hook that
  has no specification (``check_pending()``);
- one of its registration hooks raises, for instance because ``registry.add()``
  refused one of its adapters. Nothing that plugin registered is kept.

Setting ``FICC_DISABLE_PLUGIN_AUTOLOAD`` to any non-empty value turns entry-point
loading off; plugins passed explicitly as ``extra_plugins`` still register.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from importlib import metadata

import attrs
import pluggy

from .. import hookspecs
from ..hookspecs import API_VERSION
from .registries import (
    AdapterRegistry,
    ExecutorRegistry,
    Kind,
    PluginOrigin,
    PluginRecord,
    _api_version_of,
    _api_version_problem,
    _Entry,
    _Registry,
    _RegistryRefusal,
    _reported_api_version,
)
from .runtimes import RuntimeRegistry

#: The entry-point group FICC loads plugins from.
ENTRY_POINT_GROUP = "ficc.inference"
#: Any non-empty value turns entry-point autoloading off.
DISABLE_AUTOLOAD_ENV = "FICC_DISABLE_PLUGIN_AUTOLOAD"


@attrs.frozen(eq=False)
class PluginSet:
    """The outcome of loading plugins: the manager, the registries and the report."""

    manager: pluggy.PluginManager
    adapters: AdapterRegistry
    executors: ExecutorRegistry
    runtimes: RuntimeRegistry
    report: tuple[PluginRecord, ...]
    autoload: bool

    @property
    def refused(self) -> tuple[PluginRecord, ...]:
        """Return the records of everything that was refused."""
        return tuple(record for record in self.report if record.status == "refused")


def autoload_enabled() -> bool:
    """Return whether entry-point autoloading is on (``FICC_DISABLE_PLUGIN_AUTOLOAD`` unset)."""
    return not os.environ.get(DISABLE_AUTOLOAD_ENV)


def build_plugin_manager(
    *, autoload: bool | None = None, extra_plugins: Iterable[object] = ()
) -> PluginSet:
    """Build a fresh plugin manager, load every plugin, and report what happened.

    :param autoload:
        Whether to load the entry points of the group ``ficc.inference``. None
        (the default) means: unless ``FICC_DISABLE_PLUGIN_AUTOLOAD`` is set.
    :param extra_plugins:
        Plugin objects to register after the entry points (modules, classes or
        instances), checked exactly like installed ones. Tests use these.
    """
    if autoload is None:
        autoload = autoload_enabled()
    loader = _Loader()
    if autoload:
        for entry_point in _entry_points():
            loader.load_entry_point(entry_point)
    for plugin in extra_plugins:
        loader.add(plugin, PluginOrigin(_plugin_name(plugin)))
    return PluginSet(
        manager=loader.manager,
        adapters=loader.adapters,
        executors=loader.executors,
        runtimes=loader.runtimes,
        report=tuple(loader.records),
        autoload=autoload,
    )


def _entry_points() -> list[metadata.EntryPoint]:
    found = metadata.entry_points(group=ENTRY_POINT_GROUP)
    return sorted(found, key=lambda ep: (_distribution_of(ep)[0] or "", ep.name))


def _distribution_of(entry_point: metadata.EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return None, None
    return dist.name, dist.version


def _plugin_name(plugin: object) -> str:
    name = getattr(plugin, "__name__", None)
    if isinstance(name, str):
        return name
    return f"{type(plugin).__name__}@{id(plugin):x}"


class _Loader:
    """Registers plugins one at a time into one pluggy manager, recording each outcome."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager("ficc")
        self.manager.add_hookspecs(hookspecs)
        self.adapters = AdapterRegistry()
        self.executors = ExecutorRegistry()
        self.runtimes = RuntimeRegistry()
        self.records: list[PluginRecord] = []
        self._origins: dict[str, PluginOrigin] = {}

    def load_entry_point(self, entry_point: metadata.EntryPoint) -> None:
        distribution, version = _distribution_of(entry_point)
        origin = PluginOrigin(entry_point.name, distribution, version)
        try:
            plugin = entry_point.load()
        except Exception as exc:
            self._refuse(
                origin,
                f"{origin.describe()} could not be imported "
                f"({entry_point.value}): {type(exc).__name__}: {exc}",
            )
            return
        self.add(plugin, origin)

    def add(self, plugin: object, origin: PluginOrigin) -> None:
        who = origin.describe()
        api_version = _api_version_of(plugin)
        problem = _api_version_problem(api_version)
        if problem is not None:
            self._refuse(origin, f"{who} {problem}", _reported_api_version(api_version))
            return
        if not self._register(plugin, origin):
            return
        # check_pending() can only fail on the newest plugin: every earlier one passed.
        try:
            self.manager.check_pending()
        except pluggy.PluginValidationError:
            unknown = ", ".join(self._unknown_hooks(plugin))
            self._unregister(plugin, origin)
            known = ", ".join(sorted(self._known_hooks()))
            self._refuse(
                origin,
                f"{who} implements {unknown}, which API_VERSION {API_VERSION} does not "
                f"specify (its hooks are: {known})",
                api_version,
            )
            return
        self._run_registration(plugin, origin)

    def _register(self, plugin: object, origin: PluginOrigin) -> bool:
        who = origin.describe()
        taken = self._origins.get(origin.plugin)
        if taken is not None:
            self._refuse(
                origin, f"{who} has the same name as {taken.describe()}, which was loaded first"
            )
            return False
        if self.manager.is_registered(plugin):
            name = self.manager.get_name(plugin)
            assert name is not None  # it is registered, under a name
            other = self._origins[name]
            self._refuse(origin, f"{who} is the same object as {other.describe()}")
            return False
        try:
            self.manager.register(plugin, name=origin.plugin)
        except pluggy.PluginValidationError as exc:
            self._refuse(origin, f"{who} has an invalid hook implementation: {exc}")
            return False
        self._origins[origin.plugin] = origin
        return True

    def _unregister(self, plugin: object, origin: PluginOrigin) -> None:
        self.manager.unregister(plugin)
        del self._origins[origin.plugin]

    def _known_hooks(self) -> list[str]:
        return [
            name
            for name, caller in vars(self.manager.hook).items()
            if not name.startswith("_") and caller.has_spec()
        ]

    def _unknown_hooks(self, plugin: object) -> list[str]:
        unknown = []
        for name, caller in vars(self.manager.hook).items():
            if name.startswith("_") or caller.has_spec():
                continue
            if any(
                impl.plugin is plugin and not impl.optionalhook for impl in caller.get_hookimpls()
            ):
                unknown.append(name)
        return sorted(unknown)

    def _run_registration(self, plugin: object, origin: PluginOrigin) -> None:
        registries: list[tuple[str, _Registry]] = [
            ("ficc_register_adapters", self.adapters),
            ("ficc_register_executor_providers", self.executors),
            ("ficc_register_runtimes", self.runtimes),
        ]
        others = [other for other in self.manager.get_plugins() if other is not plugin]
        for _hook, registry in registries:
            registry._begin(origin)
        try:
            for hook, registry in registries:
                self.manager.subset_hook_caller(hook, remove_plugins=others)(registry=registry)
        except Exception as exc:
            for _hook, registry in registries:
                registry._finish(keep=False)
            self._unregister(plugin, origin)
            if isinstance(exc, _RegistryRefusal):
                reason = exc.message
            else:
                reason = f"{origin.describe()} failed in {hook}: {type(exc).__name__}: {exc}"
            self._refuse(origin, reason, API_VERSION)
            return
        records: list[PluginRecord] = []
        for _hook, registry in registries:
            entries, refusals = registry._finish(keep=True)
            records.extend(_loaded(entry, registry.kind, origin) for entry in entries)
            records.extend(refusals)
        if not records:
            records.append(
                _loaded(_Entry(origin.plugin, plugin, origin, API_VERSION), "plugin", origin)
            )
        self.records.extend(records)

    def _refuse(self, origin: PluginOrigin, reason: str, api_version: int | None = None) -> None:
        self.records.append(
            PluginRecord(
                name=origin.plugin,
                kind="plugin",
                plugin=origin.plugin,
                distribution=origin.distribution,
                version=origin.version,
                api_version=api_version,
                status="refused",
                reason=reason,
            )
        )


def _loaded(entry: _Entry, kind: Kind, origin: PluginOrigin) -> PluginRecord:
    return PluginRecord(
        name=entry.name,
        kind=kind,
        plugin=origin.plugin,
        distribution=origin.distribution,
        version=origin.version,
        api_version=entry.api_version,
        status="loaded",
        reason=None,
    )


__all__ = [
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "PluginSet",
    "autoload_enabled",
    "build_plugin_manager",
]
