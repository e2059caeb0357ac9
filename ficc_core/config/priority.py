"""Priority bands (docs/priority.md)."""

from __future__ import annotations

import re
from typing import Any

import attrs

from ..routing.bands import DEFAULT_BAND, DEFAULT_BANDS, Band, parse_bands, render_bands
from .fields import setting

_HEADER = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")


def _known_band(config: Any, name: str) -> None:
    if name not in {band.name for band in config.bands}:
        raise ValueError(
            f"band_default: {name!r} is not one of the bands ({render_bands(config.bands)})"
        )


def _header_name(name: str) -> None:
    if not _HEADER.fullmatch(name):
        raise ValueError(f"band_header: {name!r} is not an HTTP header name")


def _share(config: Any, share: float) -> None:
    if not 0 <= share < 1 or share * (len(config.bands) - 1) > 1:
        raise ValueError(
            f"band_min_share: {share!r} must be at least 0, below 1, and leave the bands "
            "below the top their shares together (share x (bands - 1) <= 1)"
        )


@attrs.frozen(slots=False)
class PrioritySettings:
    """Priority bands (a section of Config)."""

    bands: tuple[Band, ...] = setting(
        DEFAULT_BANDS,
        "The priority bands, each name:priority:saturation_ceiling (in TOML an array of "
        "tables with those keys). When a slot frees, the waiting request of the highest "
        "priority gets it; a band's ceiling is the share of a service's slots (replicas x "
        "concurrency) that may be busy for one of its requests to start, so a band below 1 "
        "leaves headroom for the bands above it. The default band may fill a service, so a "
        "deployment that never names a band loses no capacity; batch stops at three "
        "quarters, keeping a quarter for the others' arrivals.",
        kind="bands",
        converter=parse_bands,
    )
    band_default: str = setting(
        DEFAULT_BAND,
        "The band of a request whose credential and project name none (one of bands).",
        kind="str",
        validator=lambda config, _, name: _known_band(config, name),
    )
    band_header: str = setting(
        "x-ficc-band",
        "The request header in which a client may name a band to be served in: only one of "
        "lower priority than its credential's (or project's) band is taken, a higher one "
        "is served at the credential's band, since a header is the client's word and "
        "must not promote it; a name that is no band is refused (400 unknown_band).",
        kind="str",
        converter=lambda value: value.strip().lower(),
        validator=lambda _config, _, name: _header_name(name),
    )
    band_queue_capacity: int = setting(
        64,
        "The most requests of one band waiting for a slot of one service (also never more "
        "than 4 x the service's slots); one more is refused at once (429 service_saturated, "
        "naming the band), since a request that would wait behind that many is better told "
        "to come back than held. Per band, so one band's burst never takes another's places.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    band_queue_ttl: float = setting(
        30.0,
        "The longest a request waits in its band's queue before it is answered 503 "
        "no_ready_replica (or sooner, at the service's request deadline): under the usual "
        "60 s client and proxy timeouts, so the client hears the refusal and can retry, "
        "rather than the gateway serving a request nobody waits for (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    band_min_share: float = setting(
        0.1,
        "The share of a service's freed slots each waiting band gets at least, whatever "
        "waits above it and beyond its ceiling: a band that got fewer is owed the next one. "
        "Priority alone would starve batch under constant interactive load; a tenth keeps "
        "it moving while costing the higher bands at most one slot in ten. 0 makes "
        "priority and ceilings absolute.",
        kind="float",
        validator=lambda config, _, share: _share(config, share),
    )
