"""Contributor nodes as the controller sees them: one object the rest of the controller uses.

:class:`NodeRegistry` puts together the concerns of this package, each in its own
module: enrolment and node credentials (:mod:`.credentials`), node states from
connections, heartbeats and silence (:mod:`.states`), what each node should run
and may download (:mod:`.assignments`), and the connections this process serves
(:mod:`.live`). It adds what needs several of them: reading nodes, and the
commands sent to connected nodes (launch, stop, status, logs, the endpoint action).
All SQL is in :mod:`.repository`.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ..auth import secrets as sec
from ..executor.protocol import EndpointAction
from ..nodelink.links import NodeLink
from ..nodelink.wire import status_from_wire
from ..schema import ExecutorSnapshot, Fence, unstructure
from ..store import Store
from ..store.outage import is_store_failure
from . import repository
from .assignments import Assignments, Reconciliation, input_digests
from .credentials import NodeEnrolment, read_node
from .errors import NodeConnected, NodeHasReplicas, NodeUnavailable
from .live import LiveConnections
from .records import Assignment, AssignmentReason, Node, NodeState
from .states import NodeStates

if TYPE_CHECKING:
    from ..executor.types import AttemptStatus
    from ..schema import Job, ResourceLimits, Runtime
    from ..store import Transaction


class Leadership(Protocol):
    """Whether this controller leads, and the fencing term its commands carry
    (:class:`~ficc_core.controller.lease.LeaderLease`)."""

    @property
    def leading(self) -> bool:
        """Whether this controller holds the leader lease now."""
        ...

    @property
    def term(self) -> int:
        """The term held (or, on a standby, the newest seen)."""
        ...

    @property
    def renewing(self) -> bool:
        """Whether this controller renews its nodes' attempt leases (while it leads, and
        while the store cannot say that another does)."""
        ...

    def require_leader(self, action: str) -> None:
        """Raise ``not_leader`` unless this controller leads."""
        ...


class SoleController:
    """The leadership of a registry no lease runs for (a one-shot command, a test of the
    registry alone): it leads, at term 0 (what a node reads a message without one as)."""

    leading = True
    renewing = True
    term = 0

    def require_leader(self, action: str) -> None:
        """It always leads."""


#: The states of an attempt in a node's report that say its engine runs.
_RUNNING_STATES = frozenset({"starting", "ready"})


def stale_after(heartbeat_interval: float) -> float:
    """Seconds of silence after which a connected node missed a heartbeat: two intervals
    (so it shows within one interval of the heartbeat it missed), and at least two
    seconds more than one, so a late heartbeat on a busy host is not taken for a miss
    (the default 2 s interval: 4 s)."""
    return max(2 * heartbeat_interval, heartbeat_interval + 2.0)


class NodeRegistry:
    """The controller's record of contributor nodes, all through the :class:`Store`.

    :param unreachable_after: seconds without a heartbeat before a node is unreachable.
    :param lost_after: seconds without a heartbeat before it is lost.
    :param heartbeat_interval: how often nodes are asked to heartbeat; one that missed
        one is :meth:`stale` (see :func:`stale_after`).
    :param notify: called with a node's id when its connection here ended, or its
        first heartbeat after one it missed came (what it runs may be reached again).
    :param clock: wall-clock seconds (``time.time``; tests pass their own).
    :param leadership: whether this controller leads and its term: every command it
        sends carries the term, and only a leader launches or stops.
    :param controller_id: this controller's name: a node's connections are fenced per
        controller, so one node may keep a connection to each.
    """

    def __init__(
        self,
        store: Store,
        *,
        unreachable_after: float = 15.0,
        lost_after: float = 60.0,
        heartbeat_interval: float = 2.0,
        notify: Callable[[str], None] = lambda _node_id: None,
        clock: Callable[[], float] = time.time,
        leadership: Leadership | None = None,
        controller_id: str = "",
    ) -> None:
        self.store = store
        self.clock = clock
        self.leadership: Leadership = leadership or SoleController()
        self.stale_after = stale_after(heartbeat_interval)
        self.notify = notify
        #: When each node connected here was last heard (its last heartbeat's time).
        self._heard: dict[str, float] = {}
        #: The nodes that connected to this controller since it started.
        self._seen: set[str] = set()
        self.enrolment = NodeEnrolment(store, clock=clock)
        self.states = NodeStates(
            store,
            unreachable_after=unreachable_after,
            lost_after=lost_after,
            clock=clock,
            controller_id=controller_id,
        )
        self.wants = Assignments(store, clock=clock)
        self.live = LiveConnections()
        #: The last reconciliation of each node, by node ID.
        self.reconciled: dict[str, Reconciliation] = {}
        #: What each node's connection last reported running here (heard on a standby as
        #: on the leader), by node ID: (connection ID, the attempt IDs it runs).
        self._reports: dict[str, tuple[str, frozenset[str]]] = {}

    # -- enrolment -----------------------------------------------------------------------------

    async def add_node(
        self, name: str, *, labels: Mapping[str, str] | None = None
    ) -> tuple[Node, str]:
        """Register node ``name``; return it and its credential (shown only once)."""
        return await self.enrolment.add_node(name, labels=labels)

    async def ensure_local_node(self, name: str) -> Node:
        """Register the embedded agent's node if it is not yet (its credential is unused)."""
        return await self.enrolment.ensure_local_node(name)

    async def revoke_node(self, node_id: str) -> Node:
        """Revoke the node's credential; what it ran becomes unknown.

        Its connection to this controller ends at once; one served elsewhere ends at
        its next heartbeat.
        """
        node = await self.enrolment.revoke(node_id)
        self.live.end(node_id)
        return node

    async def remove_node(self, node_id: str) -> Node:
        """Remove a lost, revoked or never-connected node for good; return it as it was.

        Its record, its credential (which then authenticates nothing), what it
        reported and what it was assigned go in one transaction; its name can be
        registered again. A node that is connected or unreachable is refused
        (:class:`~.errors.NodeConnected`), and so is one that a service's placements
        or unreleased attempts still name (:class:`~.errors.NodeHasReplicas`).
        """

        def remove(tx: Transaction) -> Node:
            node = read_node(tx, node_id)
            live = node.state in (NodeState.CONNECTED, NodeState.UNREACHABLE)
            if live or self.live.link(node_id) is not None:
                raise NodeConnected(node_id, node.state.value)
            replicas = repository.replicas_on(tx, node_id)
            if replicas:
                raise NodeHasReplicas(node_id, replicas)
            repository.delete_node(tx, node_id)
            return node

        node = await self.store.write(remove)
        self.reconciled.pop(node_id, None)
        return node

    async def authenticate(self, token: str) -> str:
        """Return the node ID a node credential belongs to, or raise ``Unauthenticated``."""
        return await self.enrolment.authenticate(token)

    # -- reading -------------------------------------------------------------------------------

    async def list(self) -> list[Node]:
        """Every node (by name) with its state, last heartbeat, snapshot and attempts."""
        return await self.store.read(repository.list_nodes)

    async def get(self, node_id: str) -> Node:
        """One node, or :class:`~.errors.NodeNotFound`."""
        return await self.store.read(lambda tx: read_node(tx, node_id))

    async def snapshot(self, node_id: str) -> ExecutorSnapshot | None:
        """The node's last snapshot as the schema type, or None before its first heartbeat."""
        return (await self.get(node_id)).executor_snapshot()

    async def inference_refusal(self, node_id: str) -> dict[str, str] | None:
        """Why ``node_id`` cannot take an inference replica now, or None when it can.

        Placement asks this for every replica. A node whose executor snapshot does
        not advertise ``endpoint_version: 1`` (older executors, or a provider that
        cannot isolate engines) is refused for inference only: the jobs it already
        runs, its leases and its heartbeats are unaffected.
        """
        node = await self.get(node_id)
        if node.state != NodeState.CONNECTED:
            return {
                "code": "node_unavailable",
                "message": f"node {node_id} is {node.state}; it takes no new work",
            }
        snapshot = node.executor_snapshot()
        if snapshot is None or not snapshot.supports_inference:
            found = None if snapshot is None else snapshot.endpoint_version
            return {
                "code": "endpoint_version_unsupported",
                "message": f"node {node_id}'s executors advertise endpoint_version {found}, "
                "not 1; upgrade its executors (or fix their isolation) to place inference "
                "services there",
            }
        return None

    # -- connections and heartbeats ------------------------------------------------------------

    async def connect(
        self,
        node_id: str,
        scope: trio.CancelScope | None = None,
        link: NodeLink | None = None,
    ) -> str:
        """Start a connection for ``node_id``: it replaces (fences out) any older one.

        ``scope`` is cancelled when a newer connection or a revocation replaces this
        one; ``link`` carries commands to the node while it is connected.
        """
        connection_id = sec.new_id()
        await self.states.connect(node_id, connection_id)
        self.live.replace(node_id, connection_id, scope, link)
        self._seen.add(node_id)
        return connection_id

    def replaced(self, node_id: str, connection_id: str) -> bool:
        """Whether a newer connection of the node took over from ``connection_id``."""
        return self.live.replaced(node_id, connection_id)

    def disconnect(self, node_id: str, connection_id: str) -> None:
        """Forget a live connection that ended (its state then follows the heartbeat clock)."""
        self.live.forget(node_id, connection_id)
        if not self.connected_here(node_id):
            self._heard.pop(node_id, None)
            self._reports.pop(node_id, None)
            self.notify(node_id)

    def drop_connection(self, node_id: str) -> bool:
        """End the node's connection to this controller as a dropped network would.

        The agent reconnects (and is reconciled); return whether it was connected.
        """
        return self.live.cancel(node_id)

    def reconciliation(self, node_id: str) -> Reconciliation | None:
        """The reconciliation of the node's live connection here: None while it has none
        yet (its first heartbeat is not reconciled), or the node is not connected here."""
        result = self.reconciled.get(node_id)
        if (
            result is None
            or not self.connected_here(node_id)
            or self.live.replaced(node_id, result.connection_id)
        ):
            return None
        return result

    def require_connected(self, node_id: str, action: str | None = None) -> None:
        """Refuse (502 ``node_unavailable``) when ``node_id``'s agent is not connected here."""
        self.live.require_link(node_id, action)

    def connected_here(self, node_id: str) -> bool:
        """Whether ``node_id`` has a live connection to this controller."""
        return self.live.link(node_id) is not None

    def silence(self, node_id: str) -> float | None:
        """Seconds since a node connected here was last heard; None when it is not."""
        heard = self._heard.get(node_id)
        if heard is None or not self.connected_here(node_id):
            return None
        return max(0.0, self.clock() - heard)

    def trouble(self, node_id: str) -> str | None:
        """Why what ``node_id`` runs cannot count as serving now, or None when it can.

        A node not connected here cannot be reached (one that has not connected since
        this controller started says so: after a restart its agent comes back by
        itself); one connected but silent for
        longer than :attr:`stale_after` missed a heartbeat. Either shows on its
        replicas at once, long before the node is unreachable or lost. On the leader
        (which reconciles each connection's first report), a connection whose report is
        not reconciled yet has not confirmed what it runs: after a controller restart,
        what the store says a node runs is only what it ran before. A connection whose
        heartbeats this controller heard already (it was a standby a moment ago: a change
        of leader, or the end of a store outage) has said what it runs: what it listed
        as running goes on counting while the new leader reconciles
        (:meth:`attempt_trouble`), so services do not flap ready -> starting -> ready.
        """
        if not self.connected_here(node_id):
            if node_id not in self._seen:
                # The controller (re)started and the node is not back yet: say so, not
                # that it dropped out.
                return (
                    f"node {node_id} has not connected to this controller since it started "
                    "(its agent reconnects by itself)"
                )
            return f"node {node_id} is not connected to this controller"
        silent = self.silence(node_id)
        if silent is None:
            return f"node {node_id} connected but has not reported yet"
        if (
            self.leadership.leading
            and self.reconciliation(node_id) is None
            and self.live_report(node_id) is None
        ):
            return f"node {node_id} connected but what it runs is not reconciled yet"
        if silent > self.stale_after:
            return f"node {node_id} missed its heartbeats (none for over {self.stale_after:g} s)"
        return None

    def attempt_trouble(self, node_id: str, attempt_id: str) -> str | None:
        """Why attempt ``attempt_id`` on ``node_id`` cannot count as serving now, or None.

        Its node's :meth:`trouble`; else, when the node's live connection reported on
        (re)connecting that it no longer runs the attempt (the reconciliation's
        ``missing``): its record may still say ready until the controller ends it.
        """
        why = self.trouble(node_id)
        if why is None and self.dropped(node_id, attempt_id):
            why = f"node {node_id} reported on connecting that it no longer runs it"
        if why is None and self.leadership.leading and self.reconciliation(node_id) is None:
            running = self.live_report(node_id)
            if running is not None and attempt_id not in running:
                why = f"node {node_id} connected but what it runs is not reconciled yet"
        return why

    def live_report(self, node_id: str) -> frozenset[str] | None:
        """The attempts the node's live connection here last reported running (its last
        heartbeat), or None before that connection's first heartbeat."""
        report = self._reports.get(node_id)
        if report is None or not self.connected_here(node_id):
            return None
        connection_id, running = report
        if self.live.replaced(node_id, connection_id):
            return None
        return running

    def dropped(self, node_id: str, attempt_id: str) -> bool:
        """Whether the node's live connection here reported on (re)connecting that it no
        longer runs ``attempt_id`` (its reconciliation's ``missing``)."""
        reconciled = self.reconciliation(node_id)
        return reconciled is not None and attempt_id in reconciled.missing

    async def heartbeat(
        self,
        node_id: str,
        connection_id: str,
        snapshot: ExecutorSnapshot,
        attempts: Sequence[Mapping[str, Any]] = (),
    ) -> Node | None:
        """Record a heartbeat: the node is connected, its snapshot and attempts are current.

        The attempts (the agent's report) replace what the node reported before. A
        heartbeat from a connection that a newer one replaced raises
        :class:`~.errors.ConnectionFenced`.

        While the store fails, the heartbeat is heard in memory only and None is
        returned: the node's connection goes on, what it runs stays routed (it is not
        :meth:`trouble`), and its silence is judged from when the store answers again
        (:class:`~.states.NodeStates`), so an outage is never taken for the node's.
        """
        stale = self.trouble(node_id) is not None
        node: Node | None
        try:
            heard = await self.states.heartbeat(node_id, connection_id, snapshot, attempts)
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            self.states.outage.failed(exc, f"heartbeat of node {node_id}")
            node = None
            self._heard[node_id] = self.clock()
        else:
            node = heard
            if heard.last_heartbeat is not None:
                self._heard[node_id] = heard.last_heartbeat
        self._reports[node_id] = (
            connection_id,
            frozenset(str(a["attempt_id"]) for a in attempts if a.get("state") in _RUNNING_STATES),
        )
        if stale and self.trouble(node_id) is None:
            self.notify(node_id)
        return node

    async def sweep(self) -> builtins.list[tuple[str, NodeState]]:
        """Move silent nodes to unreachable or lost; return the ``(node, state)`` changes."""
        return await self.states.sweep()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep node states on a short period until cancelled."""
        await self.states.run(task_status=task_status)

    # -- commands to connected nodes -----------------------------------------------------------

    async def _call(self, link: NodeLink, message: dict[str, Any]) -> dict[str, Any]:
        """Send one command stamped with this controller's term (the node refuses a
        launch or stop with a lower term than it has seen: ``stale_term``)."""
        return await link.call({**message, "term": self.leadership.term})

    async def _link_for_new_work(self, node_id: str) -> NodeLink:
        link = self.live.link(node_id)
        node = await self.get(node_id)
        if link is None or node.state != NodeState.CONNECTED:
            raise NodeUnavailable(
                f"node {node_id!r} is {node.state}"
                + ("" if link else " and not connected to this controller")
                + "; it takes no new work",
                details={"node": node_id, "state": node.state},
            )
        return link

    async def launch(
        self,
        node_id: str,
        provider: str,
        job: Job,
        fence: Fence,
        *,
        limits: ResourceLimits | None = None,
        runtime: Runtime | None = None,
        blobs: Mapping[str, int] | None = None,
        directories: Mapping[str, Mapping[str, tuple[str, int]]] | None = None,
    ) -> AttemptStatus:
        """Launch ``job`` as attempt ``fence`` on a connected node (unreachable nodes refuse).

        ``blobs`` (digest to size, from the model's manifest) lets a remote node stage
        the job's blob inputs it does not hold from this controller before launching;
        ``directories`` does the same for directory inputs (input id to its files,
        relative path to ``(digest, size)``).

        Only the leader launches (``not_leader`` on a standby).
        """
        self.leadership.require_leader("launching an attempt")
        link = await self._link_for_new_work(node_id)
        message: dict[str, Any] = {
            "op": "launch",
            "provider": provider,
            "job": unstructure(job),
            "fence": unstructure(fence),
        }
        if limits is not None:
            message["limits"] = unstructure(limits)
        if runtime is not None:
            message["runtime"] = unstructure(runtime)
        if blobs:
            message["blobs"] = dict(blobs)
        if directories:
            message["directories"] = {
                input_id: {path: list(entry) for path, entry in files.items()}
                for input_id, files in directories.items()
            }
        await self.assign(node_id, fence, provider, inputs=input_digests(blobs, directories))
        done = False
        try:
            reply = await self._call(link, message)
            done = True
        finally:
            if not done:
                with trio.CancelScope(shield=True):
                    await self.wants.unwant(
                        node_id, fence.attempt_id, AssignmentReason.LAUNCH_FAILED
                    )
        return status_from_wire(reply["status"])

    def endpoint(self, node_id: str) -> EndpointAction:
        """The endpoint action (``open`` / ``read`` / ``cancel``) of a connected node.

        The same interface for the embedded agent (in-process) and a remote one
        (relayed over its connection). Streams opened through it end with
        ``StreamFailed(peer_lost)`` if that connection drops; ask again after a
        reconnect. Raises ``node_unavailable`` when the node is not connected here.
        """
        return self.live.require_link(node_id).endpoint

    async def stop(self, node_id: str, fence: Fence, grace: float = 10.0) -> AttemptStatus:
        """Stop an attempt on a connected node (only the leader stops: ``not_leader``)."""
        self.leadership.require_leader("stopping an attempt")
        link = self.live.require_link(node_id)
        await self.wants.unwant(node_id, fence.attempt_id, AssignmentReason.STOPPED)
        reply = await self._call(link, {"op": "stop", "fence": unstructure(fence), "grace": grace})
        return status_from_wire(reply["status"])

    async def status(self, node_id: str, fence: Fence) -> AttemptStatus:
        """Where an attempt on a connected node stands (the node's error when it does not know it).

        Raises ``node_unavailable`` when the node is not connected to this controller.
        """
        reply = await self._call(
            self.live.require_link(node_id), {"op": "status", "fence": unstructure(fence)}
        )
        return status_from_wire(reply["status"])

    async def doctor(self, node_id: str) -> tuple[builtins.list[dict[str, Any]], float]:
        """The node's own ``ficc doctor`` findings and its clock (epoch seconds).

        Raises ``node_unavailable`` when the node is not connected to this controller.
        """
        reply = await self.live.require_link(node_id).call({"op": "doctor"})
        return list(reply.get("findings") or ()), float(reply.get("time") or 0.0)

    async def logs(self, node_id: str, fence: Fence, tail: int = 100) -> builtins.list[str]:
        """The last ``tail`` lines of an attempt's log on a connected node (also once ended).

        Raises ``node_unavailable`` when the node is not connected to this controller.
        """
        reply = await self._call(
            self.live.require_link(node_id),
            {"op": "logs", "fence": unstructure(fence), "tail": tail},
        )
        return [str(line) for line in reply.get("lines", ())]

    def follow_logs(
        self, node_id: str, fence: Fence, tail: int | None = None
    ) -> AsyncGenerator[str, None]:
        """Follow an attempt's log on a connected node: the last ``tail`` lines, then new ones.

        Bounded and backpressured like the endpoint action (a remote node's follow is
        a relayed stream); it ends when the attempt's log closes, and closing the
        iterator ends the follow on the node. Raises ``node_unavailable`` when the
        node is not connected to this controller.
        """
        return self.live.require_link(node_id).follow_logs(fence, tail)

    # -- what the controller wants each node to run ---------------------------------------------

    async def assign(
        self, node_id: str, fence: Fence, provider: str, *, inputs: Sequence[str] = ()
    ) -> None:
        """Record that the controller wants ``node_id`` to run attempt ``fence``.

        ``inputs`` are the hex digests of the blobs the node may download for it
        (:meth:`may_download`), for as long as the attempt stays wanted.
        """
        await self.wants.assign(node_id, fence, provider, inputs=inputs)

    async def may_download(self, node_id: str, sha256: str) -> bool:
        """Whether ``node_id`` may download blob ``sha256`` (hex) now (see :mod:`.assignments`)."""
        return await self.wants.may_download(node_id, sha256)

    async def assignments(self, node_id: str) -> builtins.list[Assignment]:
        """The attempts the controller asked ``node_id`` to run, each with ``wanted`` and why."""
        return await self.wants.of_node(node_id)

    async def wanted_attempt_ids(self, node_id: str) -> builtins.list[str]:
        """The attempts the controller still wants ``node_id`` to run (before it reconnects)."""
        return await self.wants.wanted_attempt_ids(node_id)

    async def give_up(
        self, node_id: str, attempt_id: str, *, reason: AssignmentReason = AssignmentReason.GIVEN_UP
    ) -> bool:
        """Record that the controller no longer wants the attempt; return whether it knew it.

        Nothing is sent: a connected node's attempt is stopped with :meth:`stop`; a
        disconnected node's is stopped when it reconnects and reports it.
        """
        return await self.wants.unwant(node_id, attempt_id, reason)

    async def reconcile(
        self,
        node_id: str,
        connection_id: str,
        reported: Sequence[Mapping[str, Any]],
        known: Sequence[str] = (),
    ) -> Reconciliation:
        """Compare what a (re)connected node runs with what the controller wants.

        See :meth:`.assignments.Assignments.reconcile`; the result is also kept in
        :attr:`reconciled`.
        """
        result = await self.wants.reconcile(node_id, connection_id, reported, known)
        self.reconciled[node_id] = result
        # What it runs is now confirmed (its trouble may have gone): what runs there is
        # looked at again at once.
        self.notify(node_id)
        return result
