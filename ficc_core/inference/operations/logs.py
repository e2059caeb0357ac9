"""A replica's engine log: the last lines of its latest attempt, or a follow of it.

The log lives on the attempt's node (the executor's bounded log of the attempt); the
controller reads it through the node's link, the embedded node's in-process and a
remote node's over its connection (:meth:`NodeRegistry.logs` and
:meth:`NodeRegistry.follow_logs`). A replica's *latest attempt* is the one with the
highest generation and number; its log stays readable on the node after it ended,
while the node keeps it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

import attrs

from ...base.errors import FiccError, NotFound

if TYPE_CHECKING:
    from ...contributors import NodeRegistry
    from ..manager import InferenceManager
    from ..records import AttemptRecord

#: The most lines a snapshot (or a follow's first part) asks for.
MAX_TAIL = 1000
#: Lines a snapshot returns when the request names no ``tail``.
DEFAULT_TAIL = 100


class NoAttempt(FiccError):
    """The replica has no attempt on a node yet: there is no log to read."""

    status = 422
    code = "replica_not_started"


@attrs.frozen(kw_only=True)
class ReplicaLog:
    """The last lines of a replica's latest attempt, and which attempt it is."""

    service_id: str
    replica: int
    attempt_id: str
    attempt_state: str
    node_id: str
    lines: tuple[str, ...]


class ReplicaLogs:
    """Finds a replica's latest attempt and reads or follows its log on its node."""

    def __init__(self, inference: InferenceManager, nodes: NodeRegistry) -> None:
        self.inference = inference
        self.nodes = nodes

    async def latest_attempt(
        self, project_id: str, service_id: str, replica: int, *, action: str = "logs"
    ) -> AttemptRecord:
        """The replica's latest attempt that reached its node.

        An unknown service is 404 ``service_not_found``, a replica index outside the
        specification's placements 404 ``replica_not_found``, a replica with no
        attempt sent to its node 422 ``replica_not_started``.
        """
        detail = await self.inference.get(project_id, service_id)
        placements = detail.service.specification().placements
        service = detail.service.alias
        if not 0 <= replica < len(placements):
            raise NotFound(
                f"service {service} has no replica {replica}; its replicas are "
                f"0..{len(placements) - 1}",
                code="replica_not_found",
                details={
                    "action": action,
                    "service": service,
                    "replica": replica,
                    "replicas": len(placements),
                },
            )
        launched = [
            attempt
            for attempt in detail.attempts
            if attempt.replica == replica and attempt.plan_digest is not None
        ]
        if not launched:
            node = placements[replica].node_id
            raise NoAttempt(
                f"replica {replica} of {service} has not been started on {node} yet, so "
                "it has no log; start the service first",
                details={
                    "action": action,
                    "service": service,
                    "replica": replica,
                    "node": node,
                    "reason": "replica_not_started",
                },
            )
        return max(launched, key=lambda attempt: (attempt.generation, attempt.number))

    async def snapshot(
        self, project_id: str, service_id: str, replica: int, tail: int = DEFAULT_TAIL
    ) -> ReplicaLog:
        """The last ``tail`` lines of the replica's latest attempt's log."""
        attempt = await self.latest_attempt(project_id, service_id, replica)
        lines = await self.nodes.logs(attempt.node_id, attempt.fence, tail)
        return ReplicaLog(
            service_id=service_id,
            replica=replica,
            attempt_id=attempt.attempt_id,
            attempt_state=attempt.state,
            node_id=attempt.node_id,
            lines=tuple(lines),
        )

    def follow(self, attempt: AttemptRecord, tail: int) -> AsyncGenerator[str, None]:
        """The attempt's last ``tail`` log lines, then new ones, until it ends on its node.

        Closing the iterator ends the follow on the node.
        """
        return self.nodes.follow_logs(attempt.node_id, attempt.fence, tail)
