"""Priority bands: named classes of inference traffic, each with a priority and a ceiling.

The ``bands`` setting lists them (:mod:`.config` parses it with :func:`parse_bands`);
authentication checks the band a credential or project is given against them, and
the gateway's admission queues requests by them. docs/priority.md describes it all.

A request's band is decided by :meth:`BandTable.effective`: its credential's band,
else its project's, else ``band_default`` is what it is *entitled* to; a band header
may name a band of lower priority (the request is served there), never a higher one
(it is served at its entitled band).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ..base.errors import ConfigError, InvalidRequest

__all__ = [
    "BAND_NAME",
    "DEFAULT_BAND",
    "DEFAULT_BANDS",
    "Band",
    "BandTable",
    "UnknownBand",
    "parse_bands",
]

#: What a band's name is made of.
BAND_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


@attrs.frozen
class Band:
    """One band: requests of higher ``priority`` get freed slots first; a request of
    this band starts only while fewer than ``saturation_ceiling`` of its service's
    slots (replicas x concurrency) are busy."""

    name: str
    priority: int
    saturation_ceiling: float

    def slots(self, capacity: int) -> int:
        """How many of ``capacity`` slots may be busy for a request of this band to start
        (at least one, so a band is never shut out of a small service)."""
        return max(1, math.floor(self.saturation_ceiling * capacity + 1e-9))

    def __str__(self) -> str:
        return f"{self.name}:{self.priority}:{self.saturation_ceiling:g}"


#: Three bands: a person waiting, the default, and work nobody watches. The default
#: band may fill a service (a deployment that never names a band loses no capacity);
#: batch starts only while a quarter of the slots are free, which keeps them for the
#: others' arrivals.
DEFAULT_BANDS: tuple[Band, ...] = (
    Band("interactive", 100, 1.0),
    Band("standard", 50, 1.0),
    Band("batch", 10, 0.75),
)
DEFAULT_BAND = "standard"


def _band(entry: Any, where: str) -> Band:
    if isinstance(entry, Band):
        return entry
    if isinstance(entry, str):
        parts = entry.strip().split(":")
        if len(parts) != 3:
            raise ConfigError(f"{where}: {entry!r} is not name:priority:ceiling")
        name, priority, ceiling = (part.strip() for part in parts)
        try:
            return _checked(name, int(priority), float(ceiling), where)
        except ValueError:
            raise ConfigError(
                f"{where}: {entry!r}: the priority must be an integer and the ceiling a number"
            ) from None
    if isinstance(entry, Mapping):
        unknown = sorted(set(entry) - {"name", "priority", "saturation_ceiling"})
        missing = sorted({"name", "priority", "saturation_ceiling"} - set(entry))
        if unknown or missing:
            raise ConfigError(
                f"{where}: a band is {{name, priority, saturation_ceiling}}"
                + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                + (f"; missing: {', '.join(missing)}" if missing else "")
            )
        name, priority, ceiling = entry["name"], entry["priority"], entry["saturation_ceiling"]
        if not isinstance(name, str):
            raise ConfigError(f"{where}: a band's name must be a string, got {name!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigError(f"{where}: band {name!r}: the priority must be an integer")
        if isinstance(ceiling, bool) or not isinstance(ceiling, int | float):
            raise ConfigError(f"{where}: band {name!r}: the saturation_ceiling must be a number")
        return _checked(name, priority, float(ceiling), where)
    raise ConfigError(f"{where}: a band is a table or name:priority:ceiling, got {entry!r}")


def _checked(name: str, priority: int, ceiling: float, where: str) -> Band:
    if not BAND_NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: {name!r} is not a band name (lower-case letters, digits, '-' and '_', "
            "at most 32)"
        )
    if not (math.isfinite(ceiling) and 0 < ceiling <= 1):
        raise ConfigError(
            f"{where}: band {name!r}: the saturation_ceiling must be above 0 and at most 1"
        )
    if not -(2**31) <= priority < 2**31:
        raise ConfigError(f"{where}: band {name!r}: the priority is out of range")
    return Band(name, priority, ceiling)


def parse_bands(value: Any, where: str = "bands") -> tuple[Band, ...]:
    """The bands of a setting: a TOML array of tables, a compact string
    (``interactive:100:1.0,batch:10:0.75``) or bands; highest priority first.

    Names and priorities are unique (which band is lower must never be a tie).
    """
    entries: Iterable[Any]
    if isinstance(value, str):
        entries = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, list | tuple):
        entries = value
    else:
        raise ConfigError(f"{where}: expected a list of bands, got {value!r}")
    bands = [_band(entry, where) for entry in entries]
    if not bands:
        raise ConfigError(f"{where}: at least one band is needed")
    for attribute in ("name", "priority"):
        seen: set[Any] = set()
        for band in bands:
            if getattr(band, attribute) in seen:
                raise ConfigError(
                    f"{where}: two bands share the {attribute} {getattr(band, attribute)!r}"
                )
            seen.add(getattr(band, attribute))
    return tuple(sorted(bands, key=lambda band: -band.priority))


def render_bands(bands: Iterable[Band]) -> str:
    """``bands`` as the compact string ``parse_bands`` reads."""
    return ",".join(str(band) for band in bands)


class UnknownBand(InvalidRequest):
    """A band name that is not one of the ``bands`` setting's."""

    code = "unknown_band"

    def __init__(self, name: str, known: Iterable[str], path: str) -> None:
        names, shown = list(known), name[:64]
        super().__init__(
            f"{shown!r} is not a band; the bands are {', '.join(names)}",
            details={
                "band": shown,
                "bands": names,
                "errors": [{"path": path, "message": "unknown band"}],
            },
        )


class BandTable:
    """The configured bands by name, and how a request's band is decided.

    :param bands: highest priority first (as :func:`parse_bands` returns them).
    :param default: the band of a request whose credential and project name none.
    """

    def __init__(self, bands: Iterable[Band] = DEFAULT_BANDS, default: str = DEFAULT_BAND) -> None:
        #: Highest priority first.
        self.ordered: tuple[Band, ...] = tuple(sorted(bands, key=lambda band: -band.priority))
        self.by_name: dict[str, Band] = {band.name: band for band in self.ordered}
        self.default = self.require(default, "$.band_default")

    def require(self, name: str, path: str = "$.band") -> Band:
        """The band named ``name``, or :class:`UnknownBand` (``path``: where it was given)."""
        band = self.by_name.get(name)
        if band is None:
            raise UnknownBand(name, self.by_name, path)
        return band

    def entitled(self, own: str | None, project: str | None) -> Band:
        """The band a credential is entitled to: its own, else its project's, else the
        default. A stored name the settings no longer list counts as none."""
        if own is not None and (band := self.by_name.get(own)) is not None:
            return band
        if project is not None and (band := self.by_name.get(project)) is not None:
            return band
        return self.default

    def effective(self, entitled: Band, asked: str | None) -> Band:
        """The band a request is served in: ``asked`` (a band header's value) when it names
        a band of lower priority than ``entitled``, else ``entitled``. A name that is no
        band is :class:`UnknownBand`."""
        if asked is None:
            return entitled
        band = self.by_name.get(asked.strip().lower())
        if band is None:
            raise UnknownBand(asked, self.by_name, "header")
        return band if band.priority < entitled.priority else entitled
