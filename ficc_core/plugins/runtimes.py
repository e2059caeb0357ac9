"""The runtimes a node has installed, and the registry runtime distributions declare them in.

A runtime is the installed, immutable image an engine runs from: for the process
provider, an executable on the node. A runtime distribution (``ficc-llama-server``)
declares its runtimes through the ``ficc_register_runtimes`` hook; an agent's TOML
declares more (:mod:`ficc_core.agent.runtimes`). Either way the agent hashes the
executable itself before it advertises the runtime, so a specification always
binds the digest of what is really there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from ..hookspecs import API_VERSION
from ..schema._convert import MAX_SAFE_INTEGER
from ..schema.spec import IDENTIFIER_PATTERN
from .registries import _Entry, _Registry


def _optional_path(value: Any) -> Path | None:
    return None if value is None else Path(value)


@attrs.frozen(kw_only=True)
class DeclaredRuntime:
    """One runtime installed on this node, as a plugin or the operator declares it.

    :ivar name: the runtime's name (``llama_server``, ...).
    :ivar provider: the executor provider that runs it (``process``, ``container``).
    :ivar image_digest: the ``sha256:<hex>`` the operator expects; None (a plugin's
        runtimes) means: whatever the executable's content hashes to.
    :ivar executable: for the process provider, the file whose sha256 is the image digest.
    :ivar engines: the engines (adapters) it serves, such as ``llama_cpp``.
    :ivar isolation: the isolation its provider applies, as a specification's runtime names it.
    :ivar network: the network the engine may use (``none`` for a managed service).
    :ivar requires_gpu: whether it runs only on a node with a GPU (create, replace,
        start and move refuse it elsewhere with ``tier_mismatch``).
    :ivar default_gpu_memory_bytes: the device memory a preview suggests a replica
        reserves on a GPU; None: no suggestion.
    """

    name: str
    provider: str
    image_digest: str | None = None
    executable: Path | None = attrs.field(default=None, converter=_optional_path)
    engines: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    isolation: str | None = None
    network: str | None = None
    requires_gpu: bool = False
    default_gpu_memory_bytes: int | None = None


class RuntimeRegistry(_Registry):
    """The runtimes installed distributions provide, by name: ``registry.add(name, ...)``."""

    kind = "runtime"
    noun = "runtime"

    def add(  # type: ignore[override]
        self,
        name: str,
        *,
        provider: str,
        executable: str | os.PathLike[str],
        engines: Iterable[str],
        isolation: str,
        network: str = "none",
        requires_gpu: bool = False,
        default_gpu_memory_bytes: int | None = None,
    ) -> None:
        """Declare the runtime ``name``: the executable ``provider`` runs for ``engines``.

        ``requires_gpu`` and ``default_gpu_memory_bytes`` are optional (CPU-capable, no
        suggestion). Raise ``PluginError``, naming the registering plugin's
        distribution, when the name is taken or invalid, the executable is not an
        absolute path, no engine is named, an engine, provider, isolation or network
        is not an identifier, ``requires_gpu`` is not a boolean or
        ``default_gpu_memory_bytes`` is not a positive integer.
        """
        declaration = {
            "provider": provider,
            "executable": executable,
            "engines": engines,
            "isolation": isolation,
            "network": network,
            "requires_gpu": requires_gpu,
            "default_gpu_memory_bytes": default_gpu_memory_bytes,
        }
        super().add(name, declaration)

    def __getitem__(self, name: str) -> DeclaredRuntime:
        """Return the runtime declared as ``name`` (KeyError when there is none)."""
        return self._entries[name].value

    def declared(self) -> tuple[DeclaredRuntime, ...]:
        """Every declared runtime, in registration order."""
        return tuple(entry.value for entry in self._entries.values())

    def _check(self, name: Any, factory: Any) -> _Entry:
        self._check_name(name)
        self._check_identifier(name, None, name)
        for field in ("provider", "isolation", "network"):
            self._check_identifier(name, field, factory[field])
        engines = factory["engines"]
        if isinstance(engines, str) or not isinstance(engines, Iterable):
            raise self._refuse(name, f"names engines {engines!r}: give a list of engine names")
        engines = tuple(engines)
        if not engines:
            raise self._refuse(name, "names no engine: give the engines it serves")
        for engine in engines:
            self._check_identifier(name, "engines", engine)
        executable = factory["executable"]
        if not isinstance(executable, str | os.PathLike) or not Path(executable).is_absolute():
            raise self._refuse(
                name, f"has executable {executable!r}, which is not an absolute path"
            )
        requires_gpu = factory["requires_gpu"]
        if not isinstance(requires_gpu, bool):
            raise self._refuse(name, f"has requires_gpu {requires_gpu!r}: give true or false")
        memory = factory["default_gpu_memory_bytes"]
        if memory is not None and (
            isinstance(memory, bool)
            or not isinstance(memory, int)
            or not 0 < memory <= MAX_SAFE_INTEGER
        ):
            raise self._refuse(
                name,
                f"has default_gpu_memory_bytes {memory!r}: give a positive number of bytes",
            )
        runtime = DeclaredRuntime(
            name=name,
            provider=factory["provider"],
            executable=Path(executable),
            engines=engines,
            isolation=factory["isolation"],
            network=factory["network"],
            requires_gpu=requires_gpu,
            default_gpu_memory_bytes=memory,
        )
        return _Entry(name, runtime, self._origin, API_VERSION)

    def _check_identifier(self, name: str, field: str | None, value: Any) -> None:
        if not isinstance(value, str) or not IDENTIFIER_PATTERN.fullmatch(value):
            what = "is" if field is None else f"has {field} {value!r}, which is"
            raise self._refuse(
                name,
                f"{what} not an identifier (a lowercase letter, then up to 63 lowercase "
                "letters, digits, '_', '.' or '-')",
            )


__all__ = ["DeclaredRuntime", "RuntimeRegistry"]
