"""The registries plugins register into, and the plugin report's records.

``registry.add(name, factory)`` checks what a plugin registers against the plugin
contract (a valid, unused name; ``API_VERSION = 1``; a callable ``job`` for an
adapter, a class for an executor provider) and raises a ``PluginError`` that
names the registering plugin's distribution.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import attrs

from ..base.errors import PluginError
from ..executor.protocol import ExecutorProvider
from ..hookspecs import API_VERSION

if TYPE_CHECKING:
    from ..schema import Job


Kind = Literal["adapter", "executor", "runtime", "plugin"]
Status = Literal["loaded", "refused"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_MISSING: Any = object()


class Adapter(Protocol):
    """What an adapter factory returns: a pure translator from a specification to a job."""

    API_VERSION: int

    def job(
        self,
        specification: Any,
        model_record: Any,
        placement: Any,
        immutable_input_references: Any,
    ) -> Job:
        """Translate one replica of a service specification into the job an executor runs."""
        ...


@attrs.frozen
class PluginOrigin:
    """Where a plugin came from: its name and, when installed, its distribution."""

    plugin: str
    distribution: str | None = None
    version: str | None = None

    def describe(self) -> str:
        """Return the phrase that names this plugin in messages."""
        if self.distribution is None:
            return f"plugin {self.plugin!r} (registered directly, not from a distribution)"
        release = (
            self.distribution if self.version is None else f"{self.distribution} {self.version}"
        )
        return f"plugin {self.plugin!r} from distribution {release!r}"


@attrs.frozen
class PluginRecord:
    """One line of the plugin report: something that loaded, or was refused and why."""

    #: The adapter, executor or runtime name; for kind "plugin", the plugin (entry point) name.
    name: str
    #: "adapter", "executor" or "runtime" for what a plugin registered; "plugin" for a plugin as a
    #: whole (refused, or loaded without registering anything).
    kind: Kind
    #: The plugin (entry point) name; None for a registry used outside any plugin.
    plugin: str | None
    #: The distribution and version the plugin was installed from, when known.
    distribution: str | None
    version: str | None
    #: The API_VERSION declared, when it is an integer.
    api_version: int | None
    status: Status
    #: Why it was refused: a sentence that names the plugin and its distribution.
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the record as plain JSON-ready data."""
        return attrs.asdict(self)


@attrs.frozen
class _Entry:
    name: str
    value: Any
    origin: PluginOrigin | None
    api_version: int


class _RegistryRefusal(PluginError):
    """A ``PluginError`` raised by ``registry.add()``; its message already names the plugin."""


def _api_version_of(obj: object) -> Any:
    try:
        return getattr(obj, "API_VERSION", _MISSING)
    except Exception:
        return _MISSING


def _api_version_problem(value: Any) -> str | None:
    """Return why ``value`` is not an acceptable API_VERSION, or None when it is."""
    if value is _MISSING:
        return f"does not declare API_VERSION; this FICC supports API_VERSION {API_VERSION}"
    if type(value) is not int or value != API_VERSION:
        return f"declares API_VERSION {value!r}; this FICC supports API_VERSION {API_VERSION}"
    return None


def _reported_api_version(value: Any) -> int | None:
    return value if type(value) is int else None


class _Registry:
    """The shared part of the adapter, executor and runtime registries."""

    kind: ClassVar[Literal["adapter", "executor", "runtime"]]
    noun: ClassVar[str]

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._origin: PluginOrigin | None = None
        self._pending: dict[str, _Entry] | None = None
        self._pending_refusals: list[PluginRecord] = []
        self._refusals: list[PluginRecord] = []

    def add(self, name: str, factory: Any) -> None:
        """Check the object ``factory`` stands for and register it under ``name``.

        Raise ``PluginError``, naming the registering plugin's distribution, when
        the name is taken or the object does not meet the plugin contract.
        """
        try:
            entry = self._check(name, factory)
        except _RegistryRefusal as refusal:
            record = PluginRecord(
                name=str(name),
                kind=self.kind,
                plugin=self._origin.plugin if self._origin else None,
                distribution=self._origin.distribution if self._origin else None,
                version=self._origin.version if self._origin else None,
                api_version=refusal.details.get("api_version"),
                status="refused",
                reason=refusal.message,
            )
            if self._pending is None:
                self._refusals.append(record)
            else:
                self._pending_refusals.append(record)
            raise
        if self._pending is None:
            self._entries[name] = entry
        else:
            self._pending[name] = entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def origin(self, name: str) -> PluginOrigin | None:
        """Return the plugin that registered ``name`` (None when added directly)."""
        return self._entries[name].origin

    def refusals(self) -> list[PluginRecord]:
        """Return the refusals of ``add()`` calls made outside any plugin."""
        return list(self._refusals)

    def _check(self, name: Any, factory: Any) -> _Entry:
        raise NotImplementedError

    def _refuse(self, name: Any, problem: str, **details: Any) -> _RegistryRefusal:
        if self._origin is None:
            message = f"{self.noun} {name!r} {problem}"
        else:
            message = f"{self._origin.describe()} registers {self.noun} {name!r}, which {problem}"
        distribution = self._origin.distribution if self._origin else None
        return _RegistryRefusal(
            message,
            distribution=distribution,
            details={
                "plugin": self._origin.plugin if self._origin else None,
                "kind": self.kind,
                "name": name if isinstance(name, str) else repr(name),
                **details,
            },
        )

    def _check_name(self, name: Any) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise self._refuse(
                name,
                "is not a valid name: use 1 to 64 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit",
            )
        holder = self._entries.get(name) or (self._pending or {}).get(name)
        if holder is not None:
            by = holder.origin.describe() if holder.origin else "a direct registration"
            raise self._refuse(name, f"is already registered by {by}")

    def _check_api_version(self, name: str, value: Any) -> None:
        problem = _api_version_problem(value)
        if problem is not None:
            raise self._refuse(name, problem, api_version=_reported_api_version(value))

    # The loader wraps each plugin's registration hooks in a transaction, so that a
    # refused plugin leaves nothing behind.
    def _begin(self, origin: PluginOrigin) -> None:
        self._origin = origin
        self._pending = {}
        self._pending_refusals = []

    def _finish(self, *, keep: bool) -> tuple[list[_Entry], list[PluginRecord]]:
        pending, refusals = self._pending or {}, self._pending_refusals
        self._origin, self._pending, self._pending_refusals = None, None, []
        if not keep:
            return [], []
        self._entries.update(pending)
        return list(pending.values()), refusals


class AdapterRegistry(_Registry):
    """The engine adapters, by engine name: ``registry.add(name, factory)``.

    The factory is called once, at registration, with no arguments; the adapter it
    returns must declare ``API_VERSION = 1`` and have a callable ``job``.
    """

    kind = "adapter"
    noun = "adapter"

    def __getitem__(self, name: str) -> Adapter:
        """Return the adapter registered as ``name`` (KeyError when there is none)."""
        return self._entries[name].value

    def _check(self, name: Any, factory: Any) -> _Entry:
        self._check_name(name)
        if not callable(factory):
            raise self._refuse(name, f"is not callable: a factory is expected, got {factory!r}")
        try:
            adapter = factory()
        except Exception as exc:
            raise self._refuse(
                name, f"could not be created: its factory raised {type(exc).__name__}: {exc}"
            ) from exc
        api_version = _api_version_of(adapter)
        self._check_api_version(name, api_version)
        if not callable(getattr(adapter, "job", None)):
            raise self._refuse(
                name,
                "has no callable job(specification, model_record, placement, "
                "immutable_input_references)",
                api_version=api_version,
            )
        return _Entry(name, adapter, self._origin, api_version)


class ExecutorRegistry(_Registry):
    """The executor provider classes, by name: ``registry.add(name, provider_class)``.

    Classes are not instantiated here: the node agent does that later, with its
    node's configuration. Each must declare the class attribute ``API_VERSION = 1``.
    """

    kind = "executor"
    noun = "executor provider"

    def __getitem__(self, name: str) -> type[ExecutorProvider]:
        """Return the provider class registered as ``name`` (KeyError when there is none)."""
        return self._entries[name].value

    def _check(self, name: Any, factory: Any) -> _Entry:
        self._check_name(name)
        if not isinstance(factory, type):
            raise self._refuse(
                name,
                "is not a class: register the provider class itself, which the agent "
                f"instantiates with its node configuration (got {factory!r})",
            )
        api_version = _api_version_of(factory)
        self._check_api_version(name, api_version)
        return _Entry(name, factory, self._origin, api_version)


__all__ = [
    "Adapter",
    "AdapterRegistry",
    "ExecutorRegistry",
    "Kind",
    "PluginOrigin",
    "PluginRecord",
]
