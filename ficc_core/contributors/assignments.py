"""What the controller wants each node to run, the inputs that lets it download, and reconciliation.

Every launch records an assignment (attempt, fence, provider, the digests the node
is told to stage). The controller stops wanting it when it stops the attempt, when
the launch failed, when the node is lost or revoked, or when it gives it up; a node
downloads a blob only while an assignment that names it is wanted. When a node
(re)connects, what it reports running is compared with what is wanted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ..schema import Fence
from ..store import Store, Transaction
from . import repository
from .records import Assignment, AssignmentReason, NodeAttempt


@attrs.frozen
class Reconciliation:
    """What the controller decided when a node (re)connected and reported its attempts.

    :ivar connection_id: the connection whose first report this was.
    :ivar adopted: attempt IDs the controller still wants: kept, their leases renewed.
    :ivar stop: fences the node runs that the controller does not want (unknown to
        it, given up, or a stale generation): the connection stops them on the node.
    :ivar missing: attempt IDs the controller wanted that the node no longer runs;
        they are no longer wanted (reason ``not_reported``).
    """

    connection_id: str
    adopted: tuple[str, ...] = ()
    stop: tuple[Fence, ...] = ()
    missing: tuple[str, ...] = ()


def input_digests(
    blobs: Mapping[str, int] | None,
    directories: Mapping[str, Mapping[str, tuple[str, int]]] | None,
) -> list[str]:
    """The hex digests a launch tells its node to stage (``sha256:`` prefixes dropped)."""
    digests = list(blobs or ())
    for files in (directories or {}).values():
        digests.extend(digest for digest, _size in files.values())
    return [digest.removeprefix("sha256:") for digest in digests]


class Assignments:
    """The controller's record of what each node should run, through the store.

    :param clock: wall-clock seconds.
    """

    def __init__(self, store: Store, *, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock

    async def assign(
        self, node_id: str, fence: Fence, provider: str, *, inputs: Sequence[str] = ()
    ) -> None:
        """Record that the controller wants ``node_id`` to run attempt ``fence``.

        ``inputs`` are the hex digests of the blobs the node may download for it
        (:meth:`may_download`), for as long as the attempt stays wanted.
        """
        assignment = Assignment(
            node_id=node_id,
            attempt_id=fence.attempt_id,
            generation=fence.generation,
            plan_digest=fence.plan_digest,
            provider=provider,
            wanted=True,
            reason=AssignmentReason.LAUNCHED,
            updated_at=self.clock(),
            inputs=tuple(sorted(set(inputs))),
        )
        await self.store.write(lambda tx: repository.put_assignment(tx, assignment))

    async def may_download(self, node_id: str, sha256: str) -> bool:
        """Whether ``node_id`` may download blob ``sha256`` (hex) now.

        Only a verified blob that a model references and that is an input of an
        attempt the controller still wants this node to run: a node never reaches
        other nodes' inputs, other projects' models, or an attempt's inputs once
        it is stopped, given up or removed.
        """

        def read(tx: Transaction) -> bool:
            return sha256 in repository.wanted_inputs(tx, node_id) and repository.blob_published(
                tx, sha256
            )

        return await self.store.read(read)

    async def unwant(self, node_id: str, attempt_id: str, reason: AssignmentReason) -> bool:
        """Stop wanting the attempt (if still wanted); return whether it was ever assigned."""
        now = self.clock()

        def write(tx: Transaction) -> bool:
            known = repository.fetch_assignment(tx, node_id, attempt_id) is not None
            repository.unwant(tx, node_id, attempt_id, reason, now)
            return known

        return await self.store.write(write)

    async def of_node(self, node_id: str) -> list[Assignment]:
        """The attempts the controller asked ``node_id`` to run, by attempt ID."""
        return await self.store.read(lambda tx: repository.fetch_assignments(tx, node_id))

    async def wanted_attempt_ids(self, node_id: str) -> list[str]:
        """The attempts the controller still wants ``node_id`` to run, by attempt ID."""
        return [a.attempt_id for a in await self.of_node(node_id) if a.wanted]

    async def reconcile(
        self,
        node_id: str,
        connection_id: str,
        reported: Sequence[Mapping[str, Any]],
        known: Sequence[str] = (),
    ) -> Reconciliation:
        """Compare what a (re)connected node runs with what the controller wants.

        An attempt the controller recorded and still wants, with the same generation
        and plan digest, is adopted; any other reported attempt (unknown here, given
        up, stopped, unknown after a loss, or a stale generation) is to be stopped.
        ``known`` are the attempts wanted before this connection began: those the
        node does not report are no longer wanted.
        """
        now = self.clock()
        fences = [NodeAttempt.from_report(attempt, updated_at=now).fence for attempt in reported]

        def write(tx: Transaction) -> Reconciliation:
            wanted = {
                a.attempt_id: a for a in repository.fetch_assignments(tx, node_id) if a.wanted
            }
            adopted, stop = [], []
            for fence in fences:
                assignment = wanted.get(fence.attempt_id)
                if assignment is not None and assignment.fence == fence:
                    adopted.append(fence.attempt_id)
                else:
                    stop.append(fence)
            seen = {fence.attempt_id for fence in fences}
            missing = [a for a in known if a not in seen and a in wanted]
            for attempt_id in missing:
                repository.unwant(tx, node_id, attempt_id, AssignmentReason.NOT_REPORTED, now)
            return Reconciliation(connection_id, tuple(adopted), tuple(stop), tuple(missing))

        return await self.store.write(write)
