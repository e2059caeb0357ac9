"""The refusals of the inference package, each with its stable code."""

from __future__ import annotations

from ..base.errors import FiccError, NotFound


class UnknownOutcome(FiccError):
    """A stopped service has a replica whose end was never confirmed."""

    status = 409
    code = "inference_unknown_outcome"


class StaleRevision(FiccError):
    """The request named a revision other than the service's current one."""

    status = 409
    code = "stale_revision"


class PlacementFailed(FiccError):
    """At least one replica does not fit on its node."""

    status = 409
    code = "placement_failed"


def service_not_found(service_id: str) -> NotFound:
    """No such service in the project (or at all)."""
    return NotFound(
        f"no inference service {service_id!r} in this project",
        code="service_not_found",
        details={"id": service_id},
    )


__all__ = ["PlacementFailed", "StaleRevision", "UnknownOutcome", "service_not_found"]
