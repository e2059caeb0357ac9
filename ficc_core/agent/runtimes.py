"""The runtimes installed on a node, and the agent's check of their digests.

Installed runtime distributions declare runtimes through the plugin hook
``ficc_register_runtimes`` (the process's plugin set holds them); the operator
declares more in the agent's TOML file, whose runtimes replace a plugin's of the
same name. A declaration names the runtime, the provider that runs it, for the
process provider the executable and, in the TOML file, the image digest the
operator expects. The agent hashes the executable itself (off the event loop); a
declaration whose file is missing or whose digest differs from the declared one
is left out of the snapshot and reported as a problem, so nothing is ever placed
on an image other than the one a specification binds.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from ..base.digests import file_digest
from ..base.errors import ConfigError
from ..plugins.runtimes import DeclaredRuntime
from ..schema import InstalledRuntime
from ..schema._convert import MAX_SAFE_INTEGER as MAX_SAFE
from ..schema.spec import DIGEST_PATTERN, IDENTIFIER_PATTERN, NODE_ID_PATTERN

_hash_limiter = trio.CapacityLimiter(2)
_RUNTIME_KEYS = {
    "name",
    "provider",
    "image_digest",
    "executable",
    "engines",
    "isolation",
    "network",
    "requires_gpu",
    "default_gpu_memory_bytes",
}


@attrs.frozen(kw_only=True)
class AgentSettings:
    """What an agent's TOML file declares: labels, installed runtimes, input staging.

    ``[labels]`` is a table of strings; each ``[[runtimes]]`` has ``name``,
    ``provider``, ``image_digest``, (process provider) ``executable`` and,
    optionally, ``engines`` (a list), ``isolation``, ``network``, ``requires_gpu``
    (a boolean) and ``default_gpu_memory_bytes`` (a positive integer);
    ``[staging] shared_dirs`` lists read-only directories (a shared filer) that may
    already hold model blobs named by their digest (see :mod:`.staging`);
    ``skip_gpus = true`` reports no GPUs without looking for them (a node whose GPUs
    serve something else, or whose driver is known broken and not to be asked).
    """

    labels: dict[str, str] = attrs.Factory(dict)
    runtimes: tuple[DeclaredRuntime, ...] = ()
    staging_shared_dirs: tuple[Path, ...] = ()
    skip_gpus: bool = False

    @classmethod
    def from_document(cls, document: Mapping[str, Any], source: str) -> AgentSettings:
        """Build settings from a parsed TOML document, naming ``source`` in errors."""
        unknown = sorted(set(document) - {"labels", "runtimes", "staging", "skip_gpus"})
        if unknown:
            raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}")
        skip_gpus = document.get("skip_gpus", False)
        if not isinstance(skip_gpus, bool):
            raise ConfigError(f"{source}: skip_gpus must be true or false")
        labels = document.get("labels", {})
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise ConfigError(f"{source}: labels must be a table of strings")
        runtimes = []
        for position, item in enumerate(document.get("runtimes", [])):
            where = f"{source}: runtimes[{position}]"
            if not isinstance(item, dict):
                raise ConfigError(f"{where} must be a table")
            extra = sorted(set(item) - _RUNTIME_KEYS)
            if extra:
                raise ConfigError(f"{where}: unknown key(s) {', '.join(extra)}")
            for key in ("name", "provider", "image_digest"):
                if not isinstance(item.get(key), str):
                    raise ConfigError(f"{where}.{key} is required and must be a string")
            for key in ("isolation", "network"):
                if key in item and not (
                    isinstance(item[key], str) and IDENTIFIER_PATTERN.fullmatch(item[key])
                ):
                    raise ConfigError(f"{where}.{key} must be an identifier such as process")
            engines = item.get("engines", [])
            if not isinstance(engines, list) or not all(
                isinstance(e, str) and IDENTIFIER_PATTERN.fullmatch(e) for e in engines
            ):
                raise ConfigError(f"{where}.engines must be a list of engine names")
            if not isinstance(item.get("requires_gpu", False), bool):
                raise ConfigError(f"{where}.requires_gpu must be true or false")
            memory = item.get("default_gpu_memory_bytes")
            if memory is not None and (
                isinstance(memory, bool)
                or not isinstance(memory, int)
                or not 0 < memory <= MAX_SAFE
            ):
                raise ConfigError(f"{where}.default_gpu_memory_bytes must be a positive integer")
            if not NODE_ID_PATTERN.fullmatch(item["name"]):
                raise ConfigError(f"{where}.name {item['name']!r} is not a runtime name")
            if not DIGEST_PATTERN.fullmatch(item["image_digest"]):
                raise ConfigError(
                    f"{where}.image_digest must be sha256: followed by 64 lowercase hex digits"
                )
            runtimes.append(DeclaredRuntime(**item))
        staging = document.get("staging", {})
        if not isinstance(staging, dict):
            raise ConfigError(f"{source}: staging must be a table")
        extra = sorted(set(staging) - {"shared_dirs"})
        if extra:
            raise ConfigError(f"{source}: staging: unknown key(s) {', '.join(extra)}")
        shared = staging.get("shared_dirs", [])
        if not isinstance(shared, list) or not all(
            isinstance(d, str) and Path(d).is_absolute() for d in shared
        ):
            raise ConfigError(f"{source}: staging.shared_dirs must be a list of absolute paths")
        return cls(
            labels=dict(labels),
            runtimes=tuple(runtimes),
            staging_shared_dirs=tuple(Path(d) for d in shared),
            skip_gpus=skip_gpus,
        )

    def beside(self, installed: Iterable[DeclaredRuntime]) -> AgentSettings:
        """These settings with the ``installed`` runtimes (the plugins') added before its own.

        A runtime these settings declare replaces an installed one of the same name.
        """
        own = {runtime.name for runtime in self.runtimes}
        kept = tuple(runtime for runtime in installed if runtime.name not in own)
        return attrs.evolve(self, runtimes=(*kept, *self.runtimes))

    @classmethod
    def load(cls, path: Path | None) -> AgentSettings:
        """Read settings from a TOML file; no file means no labels and no runtimes."""
        if path is None:
            return cls()
        try:
            document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"agent configuration file {path} does not exist") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"agent configuration file {path} is not valid TOML: {exc}") from None
        return cls.from_document(document, str(path))


@attrs.frozen
class RuntimeCheck:
    """The outcome of checking one declaration: an installed runtime, or why not."""

    declared: DeclaredRuntime
    installed: InstalledRuntime | None
    problem: str | None


async def check_runtime(
    declared: DeclaredRuntime, package_digests: Mapping[str, str]
) -> RuntimeCheck:
    """Check one declaration against the loaded providers and the file on disk."""

    def refuse(problem: str) -> RuntimeCheck:
        return RuntimeCheck(declared, None, problem)

    package = package_digests.get(declared.provider)
    if package is None:
        return refuse(f"provider {declared.provider!r} is not loaded on this node")
    if declared.executable is None:
        if declared.provider == "process":
            return refuse("a process runtime must name its executable")
        if declared.image_digest is None:
            return refuse("a runtime without an executable must declare its image digest")
        # Other providers' images (container) are verified by the provider at launch.
        actual = declared.image_digest
    else:
        try:
            actual = await trio.to_thread.run_sync(
                file_digest, declared.executable, limiter=_hash_limiter
            )
        except OSError as exc:
            return refuse(f"cannot read {declared.executable}: {exc.strerror or exc}")
        if declared.image_digest is not None and actual != declared.image_digest:
            return refuse(
                f"{declared.executable} has digest {actual}, not the declared "
                f"{declared.image_digest}"
            )
    installed = InstalledRuntime(
        name=declared.name,
        executor_provider=declared.provider,
        package_digest=package,
        image_digest=actual,
        engines=declared.engines or None,
        executable=None if declared.executable is None else str(declared.executable),
        isolation=declared.isolation,
        network=declared.network,
        # Left out for a CPU-capable runtime, so older controllers still read the snapshot.
        requires_gpu=True if declared.requires_gpu else None,
        default_gpu_memory_bytes=declared.default_gpu_memory_bytes,
    )
    return RuntimeCheck(declared, installed, None)
