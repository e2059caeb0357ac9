"""The refusals of the operations on running services (restart, move, rollout).

Each carries the details a person or a UI renders as "cannot <action> <service> on
<node>: <message>" without parsing the message: ``action``, ``service`` (its
alias), ``service_id``, ``replica``, ``node``, ``reason`` and ``raw_error`` (the
underlying error, when one caused it).
"""

from __future__ import annotations

from typing import Any

from ...base.errors import InvalidRequest
from ..records import ServiceRecord


class NothingToDo(InvalidRequest):
    """The operation has nothing to act on (the service is not running, no such replica)."""

    status = 422
    code = "nothing_to_do"


def operation_details(
    action: str, record: ServiceRecord, replica: int | None, node: str | None
) -> dict[str, Any]:
    """The structured details every refusal of ``action`` on ``record`` starts from."""
    return {
        "action": action,
        "service": record.alias,
        "service_id": record.id,
        "replica": replica,
        "node": node,
        "reason": None,
        "raw_error": None,
    }


_MESSAGES = {
    "not_running": "{alias} is not running; start it first",
    "replica_not_found": "{alias} has no replica {replica}; it has {count}",
    "replica_not_ready": "replica {replica} of {alias} is not serving yet; wait until it is "
    "ready, then try again",
    "rollout_in_progress": "{alias} is rolling out its next generation; wait until it is "
    "over, then try again",
}


def nothing_to_do(
    action: str, record: ServiceRecord, replica: int | None, node: str | None, reason: str
) -> NothingToDo:
    """The friendly 422 of an operation with nothing to act on, saying what to do first."""
    count = len(record.specification().placements)
    message = _MESSAGES[reason].format(alias=record.alias, replica=replica, count=count)
    details = operation_details(action, record, replica, node)
    details["reason"] = reason
    return NothingToDo(message, details=details)
