"""What the leader lease keeps in the store, as typed records: the leader row and the
controllers seen (:mod:`~ficc_core.controller.lease_repository` reads and writes them)."""

from __future__ import annotations

import enum

import attrs


class Role(enum.StrEnum):
    """What a controller does now."""

    LEADER = "leader"
    STANDBY = "standby"
    #: It shut down (the row of a controller seen before).
    STOPPED = "stopped"


@attrs.frozen
class LeaderRow:
    """The leader row as last read or written."""

    holder: str
    url: str
    term: int
    acquired_at: float
    expires_at: float

    def to_json(self) -> dict[str, object]:
        """The row as ``GET /api/v1/system/controllers`` shows it."""
        return {
            "id": self.holder,
            "url": self.url,
            "term": self.term,
            "acquired_at": self.acquired_at,
            "expires_at": self.expires_at,
        }


@attrs.frozen
class ControllerRow:
    """One controller seen on the store: its last role and term, when it was last heard."""

    id: str
    url: str
    role: str
    term: int
    started_at: float
    seen_at: float

    def to_json(self) -> dict[str, object]:
        """The row as ``GET /api/v1/system/controllers`` shows it."""
        return attrs.asdict(self)


__all__ = ["ControllerRow", "LeaderRow", "Role"]
