"""Contributor nodes as the controller sees them: registration, credentials, heartbeats, states.

A node is registered by an administrator (``ficc admin add-node``), which issues
a node credential: a bearer secret that can do nothing but connect as that one
node. Node state follows heartbeats: ``connected`` while they arrive,
``unreachable`` once none came for ``unreachable_after`` seconds (no new work
goes there), ``lost`` after ``lost_after`` seconds, when every attempt the node
last reported becomes ``unknown``. A node that never connected is ``registered``.

One connection per node: :meth:`NodeRegistry.connect` gives each connection a
new ID and records it; heartbeats from any older connection are refused
(:class:`ConnectionFenced`) and in-process older connections are cancelled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..auth import secrets as sec
from ..errors import Conflict, FiccError, InvalidRequest, NotFound, Unauthenticated
from ..executor.protocol import EndpointAction
from ..nodelink.links import NodeLink
from ..nodelink.wire import status_from_wire
from ..schema import ExecutorSnapshot, Fence, canonical_json, structure, unstructure
from ..schema.spec import NODE_ID_PATTERN
from ..store import Store, Transaction

if TYPE_CHECKING:
    from ..executor.types import AttemptStatus
    from ..schema import Job, ResourceLimits, Runtime

#: Node credentials look like ``ficcnode_<credential id>.<secret>``; bearer tokens never do.
NODE_TOKEN_PREFIX = "ficcnode_"
NODE_STATES = ("registered", "connected", "unreachable", "lost", "revoked")
#: Attempt states that mean the engine is over; a lost node's other attempts become unknown.
ENDED_STATES = frozenset({"exited", "stopped", "failed", "unknown"})


class ConnectionFenced(FiccError):
    """A newer connection of the same node replaced this one."""

    status = 409
    code = "connection_fenced"


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


def is_node_token(token: str) -> bool:
    """Whether ``token`` is (shaped like) a node credential."""
    return token.startswith(NODE_TOKEN_PREFIX)


def _node_view(
    row: dict[str, Any],
    attempts: list[dict[str, Any]],
    reservations: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    return {
        "id": row["id"],
        "name": row["name"],
        "state": row["state"],
        "labels": json.loads(row["labels"]),
        "credential_id": row["credential_id"],
        "last_heartbeat": row["last_heartbeat"],
        "created_at": row["created_at"],
        "revoked_at": row["revoked_at"],
        "snapshot": json.loads(row["snapshot"]) if row["snapshot"] else None,
        "reservations": reservations,
        "attempts": [
            {
                "attempt_id": a["attempt_id"],
                "generation": a["generation"],
                "plan_digest": a["plan_digest"],
                "provider": a["provider"],
                "state": a["state"],
                "updated_at": a["updated_at"],
            }
            for a in attempts
        ],
    }


def _node_not_found(node_id: str) -> NotFound:
    return NotFound(
        f"no contributor node {node_id!r}", code="node_not_found", details={"id": node_id}
    )


class NodeRegistry:
    """The controller's record of contributor nodes, all through the :class:`Store`.

    :param unreachable_after: seconds without a heartbeat before a node is unreachable.
    :param lost_after: seconds without a heartbeat before it is lost.
    :param clock: wall-clock seconds (``time.time``; tests pass their own).
    """

    def __init__(
        self,
        store: Store,
        *,
        unreachable_after: float = 15.0,
        lost_after: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.unreachable_after = unreachable_after
        self.lost_after = max(lost_after, unreachable_after)
        self.clock = clock
        # Live connections in this process, so a newer one cancels the older at once.
        self._live: dict[str, tuple[str, trio.CancelScope, NodeLink | None]] = {}
        #: The last reconciliation of each node, by node ID.
        self.reconciled: dict[str, Reconciliation] = {}

    # -- registration ------------------------------------------------------------------------

    async def add_node(
        self, name: str, *, labels: dict[str, str] | None = None
    ) -> tuple[dict[str, Any], str]:
        """Register node ``name``; return its record and its credential (shown only once)."""
        if not NODE_ID_PATTERN.fullmatch(name):
            raise InvalidRequest(
                f"{name!r} is not a node name: use up to 63 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit",
                details={"errors": [{"path": "$.name", "message": "not a node name"}]},
            )
        credential_id, secret, now = sec.new_id(), sec.new_secret(), self.clock()

        def insert(tx: Transaction) -> dict[str, Any]:
            if tx.fetch_one("SELECT id FROM nodes WHERE id = ? OR name = ?", (name, name)):
                raise Conflict(
                    f"a node named {name!r} is already registered; revoke it first to re-issue",
                    code="node_exists",
                    details={"name": name},
                )
            tx.execute(
                "INSERT INTO nodes (id, name, labels, credential_id, secret_hash, state,"
                " created_at) VALUES (?, ?, ?, ?, ?, 'registered', ?)",
                (
                    name,
                    name,
                    json.dumps(labels or {}, sort_keys=True),
                    credential_id,
                    sec.hash_secret(secret),
                    now,
                ),
            )
            return self._view(tx, name)

        record = await self.store.write(insert)
        return record, sec.make_token(credential_id, secret, NODE_TOKEN_PREFIX)

    async def ensure_local_node(self, name: str) -> dict[str, Any]:
        """Register the embedded agent's node if it is not yet (its credential is unused)."""
        try:
            return await self.get(name)
        except NotFound:
            try:
                record, _ = await self.add_node(name, labels={"ficc/embedded": "true"})
            except Conflict:
                return await self.get(name)
            return record

    async def revoke_node(self, node_id: str) -> dict[str, Any]:
        """Revoke the node's credential; its connection ends at the next heartbeat."""
        now = self.clock()

        def write(tx: Transaction) -> dict[str, Any]:
            row = tx.fetch_one("SELECT * FROM nodes WHERE id = ?", (node_id,))
            if row is None:
                raise _node_not_found(node_id)
            if row["revoked_at"] is None:
                tx.execute(
                    "UPDATE nodes SET revoked_at = ?, state = 'revoked', connection_id = NULL"
                    " WHERE id = ?",
                    (now, node_id),
                )
                self._unknown(tx, node_id, now)
            return self._view(tx, node_id)

        record = await self.store.write(write)
        live = self._live.pop(node_id, None)
        if live is not None:
            live[1].cancel()
        return record

    async def authenticate(self, token: str) -> str:
        """Return the node ID a node credential belongs to, or raise :class:`Unauthenticated`."""
        parts = sec.split_token(token, NODE_TOKEN_PREFIX)
        if parts is None:
            raise Unauthenticated(
                "only a node credential (from 'ficc admin add-node') can connect as a node",
                code="invalid_node_credential",
            )
        credential_id, secret = parts
        row = await self.store.read(
            lambda tx: tx.fetch_one("SELECT * FROM nodes WHERE credential_id = ?", (credential_id,))
        )
        if row is None or not sec.secret_matches(secret, row["secret_hash"]):
            raise Unauthenticated(
                "the node credential is not valid", code="invalid_node_credential"
            )
        if row["revoked_at"] is not None:
            raise Unauthenticated(
                f"the credential of node {row['id']!r} has been revoked", code="credential_revoked"
            )
        return row["id"]

    # -- reading -------------------------------------------------------------------------------

    def _view(self, tx: Transaction, node_id: str) -> dict[str, Any]:
        row = tx.fetch_one("SELECT * FROM nodes WHERE id = ?", (node_id,))
        if row is None:
            raise _node_not_found(node_id)
        attempts = tx.fetch_all(
            "SELECT * FROM node_attempts WHERE node_id = ? ORDER BY attempt_id", (node_id,)
        )
        reservations = [
            {
                "service_id": r["service_id"],
                "replica": r["replica"],
                "cpus": r["cpus"],
                "memory_bytes": r["memory_bytes"],
                "disk_bytes": r["disk_bytes"],
                "gpus": [{"index": i, "memory_bytes": m} for i, m in json.loads(r["gpus"])],
            }
            for r in tx.fetch_all(
                "SELECT * FROM inference_reservations WHERE node_id = ?"
                " ORDER BY service_id, replica",
                (node_id,),
            )
        ]
        return _node_view(row, attempts, reservations)

    async def list(self) -> list[dict[str, Any]]:
        """Every node with its state, last heartbeat, snapshot and attempts."""

        def read(tx: Transaction) -> list[dict[str, Any]]:
            ids = tx.fetch_all("SELECT id FROM nodes ORDER BY name")
            return [self._view(tx, row["id"]) for row in ids]

        return await self.store.read(read)

    async def get(self, node_id: str) -> dict[str, Any]:
        """One node, or :class:`NotFound`."""
        return await self.store.read(lambda tx: self._view(tx, node_id))

    async def snapshot(self, node_id: str) -> ExecutorSnapshot | None:
        """The node's last snapshot as the schema type, or None before its first heartbeat."""
        document = (await self.get(node_id))["snapshot"]
        return None if document is None else structure(document, ExecutorSnapshot)

    async def inference_refusal(self, node_id: str) -> dict[str, str] | None:
        """Why ``node_id`` cannot take an inference replica now, or None when it can.

        Placement asks this for every replica. A node whose executor snapshot does
        not advertise ``endpoint_version: 1`` (older executors, or a provider that
        cannot isolate engines) is refused for inference only: the jobs it already
        runs, its leases and its heartbeats are unaffected.
        """
        node = await self.get(node_id)
        if node["state"] != "connected":
            return {
                "code": "node_unavailable",
                "message": f"node {node_id} is {node['state']}; it takes no new work",
            }
        snapshot = await self.snapshot(node_id)
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

        def write(tx: Transaction) -> None:
            row = tx.fetch_one("SELECT revoked_at FROM nodes WHERE id = ?", (node_id,))
            if row is None:
                raise _node_not_found(node_id)
            if row["revoked_at"] is not None:
                raise Unauthenticated(
                    f"the credential of node {node_id!r} has been revoked",
                    code="credential_revoked",
                )
            tx.execute("UPDATE nodes SET connection_id = ? WHERE id = ?", (connection_id, node_id))

        await self.store.write(write)
        older = self._live.pop(node_id, None)
        if older is not None:
            older[1].cancel()
        if scope is not None:
            self._live[node_id] = (connection_id, scope, link)
        return connection_id

    def replaced(self, node_id: str, connection_id: str) -> bool:
        """Whether a newer connection of the node took over from ``connection_id``."""
        live = self._live.get(node_id)
        return live is not None and live[0] != connection_id

    def disconnect(self, node_id: str, connection_id: str) -> None:
        """Forget a live connection that ended (its state then follows the heartbeat clock)."""
        live = self._live.get(node_id)
        if live is not None and live[0] == connection_id:
            del self._live[node_id]

    async def heartbeat(
        self,
        node_id: str,
        connection_id: str,
        snapshot: ExecutorSnapshot,
        attempts: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        """Record a heartbeat: the node is connected, its snapshot and attempts are current.

        The attempts replace what the node reported before. A heartbeat from a
        connection that a newer one replaced raises :class:`ConnectionFenced`.
        """
        if snapshot.node_id != node_id:
            raise InvalidRequest(
                f"the snapshot names node {snapshot.node_id!r}, but this is node {node_id!r}",
                code="node_mismatch",
            )
        document = canonical_json(snapshot).decode("utf-8")
        now = self.clock()

        def write(tx: Transaction) -> dict[str, Any]:
            row = tx.fetch_one("SELECT * FROM nodes WHERE id = ?", (node_id,))
            if row is None:
                raise _node_not_found(node_id)
            if row["revoked_at"] is not None:
                raise Unauthenticated(
                    f"the credential of node {node_id!r} has been revoked",
                    code="credential_revoked",
                )
            if row["connection_id"] != connection_id:
                raise ConnectionFenced(
                    f"a newer connection of node {node_id!r} replaced this one",
                    details={"node": node_id},
                )
            tx.execute(
                "UPDATE nodes SET state = 'connected', last_heartbeat = ?, snapshot = ?"
                " WHERE id = ?",
                (now, document, node_id),
            )
            tx.execute("DELETE FROM node_attempts WHERE node_id = ?", (node_id,))
            for attempt in attempts:
                tx.execute(
                    "INSERT INTO node_attempts (node_id, attempt_id, generation, plan_digest,"
                    " provider, state, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        node_id,
                        attempt["attempt_id"],
                        attempt["generation"],
                        attempt["plan_digest"],
                        attempt["provider"],
                        attempt["state"],
                        now,
                    ),
                )
            return self._view(tx, node_id)

        return await self.store.write(write)

    # -- commands to connected nodes ----------------------------------------------------------

    async def _link(self, node_id: str) -> NodeLink:
        live = self._live.get(node_id)
        node = await self.get(node_id)
        if live is None or live[2] is None or node["state"] != "connected":
            raise Conflict(
                f"node {node_id!r} is {node['state']}"
                + ("" if live else " and not connected to this controller")
                + "; it takes no new work",
                code="node_unavailable",
                details={"node": node_id, "state": node["state"]},
            )
        return live[2]

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
        """
        link = await self._link(node_id)
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
        await self.assign(node_id, fence, provider, inputs=_input_digests(blobs, directories))
        done = False
        try:
            reply = await link.call(message)
            done = True
        finally:
            if not done:
                with trio.CancelScope(shield=True):
                    await self._unwant(node_id, fence.attempt_id, "launch_failed")
        return status_from_wire(reply["status"])

    def endpoint(self, node_id: str) -> EndpointAction:
        """The endpoint action (``open`` / ``read`` / ``cancel``) of a connected node.

        The same interface for the embedded agent (in-process) and a remote one
        (relayed over its connection). Streams opened through it end with
        ``StreamFailed(peer_lost)`` if that connection drops; ask again after a
        reconnect. Raises ``node_unavailable`` when the node is not connected here.
        """
        return self._connected_link(node_id).endpoint

    def _connected_link(self, node_id: str) -> NodeLink:
        """The link of a node connected to this controller, or ``node_unavailable``."""
        live = self._live.get(node_id)
        if live is None or live[2] is None:
            raise Conflict(
                f"node {node_id!r} is not connected to this controller",
                code="node_unavailable",
                details={"node": node_id},
            )
        return live[2]

    async def stop(self, node_id: str, fence: Fence, grace: float = 10.0) -> AttemptStatus:
        """Stop an attempt on a connected node."""
        link = self._connected_link(node_id)
        await self._unwant(node_id, fence.attempt_id, "stopped")
        reply = await link.call({"op": "stop", "fence": unstructure(fence), "grace": grace})
        return status_from_wire(reply["status"])

    async def status(self, node_id: str, fence: Fence) -> AttemptStatus:
        """Where an attempt on a connected node stands (the node's error when it does not know it).

        Raises ``node_unavailable`` when the node is not connected to this controller.
        """
        reply = await self._connected_link(node_id).call(
            {"op": "status", "fence": unstructure(fence)}
        )
        return status_from_wire(reply["status"])

    def connected_here(self, node_id: str) -> bool:
        """Whether ``node_id`` has a live connection to this controller."""
        live = self._live.get(node_id)
        return live is not None and live[2] is not None

    # -- what the controller wants each node to run ---------------------------------------------

    async def assign(
        self, node_id: str, fence: Fence, provider: str, *, inputs: Sequence[str] = ()
    ) -> None:
        """Record that the controller wants ``node_id`` to run attempt ``fence``.

        ``inputs`` are the hex digests of the blobs the node may download for it
        (:meth:`may_download`), for as long as the attempt stays wanted.
        """
        now = self.clock()
        await self.store.write(
            lambda tx: tx.execute(
                "INSERT OR REPLACE INTO node_assignments (node_id, attempt_id, generation,"
                " plan_digest, provider, wanted, reason, updated_at, inputs)"
                " VALUES (?, ?, ?, ?, ?, 1, 'launched', ?, ?)",
                (
                    node_id,
                    fence.attempt_id,
                    fence.generation,
                    fence.plan_digest,
                    provider,
                    now,
                    json.dumps(sorted(set(inputs))),
                ),
            )
        )

    async def may_download(self, node_id: str, sha256: str) -> bool:
        """Whether ``node_id`` may download blob ``sha256`` (hex) now.

        Only a verified blob that a model references and that is an input of an
        attempt the controller still wants this node to run: a node never reaches
        other nodes' inputs, other projects' models, or an attempt's inputs once
        it is stopped, given up or removed. One indexed query (a node's assignments).
        """
        row = await self.store.read(
            lambda tx: tx.fetch_one(
                "SELECT 1 AS ok FROM blobs b WHERE b.sha256 = ? AND b.state = 'verified'"
                " AND EXISTS (SELECT 1 FROM model_files f WHERE f.sha256 = b.sha256)"
                " AND EXISTS (SELECT 1 FROM node_assignments a, json_each(a.inputs) i"
                " WHERE a.node_id = ? AND a.wanted = 1 AND i.value = b.sha256)",
                (sha256, node_id),
            )
        )
        return row is not None

    async def _unwant(self, node_id: str, attempt_id: str, reason: str) -> bool:
        now = self.clock()

        def write(tx: Transaction) -> bool:
            row = tx.fetch_one(
                "SELECT wanted FROM node_assignments WHERE node_id = ? AND attempt_id = ?",
                (node_id, attempt_id),
            )
            tx.execute(
                "UPDATE node_assignments SET wanted = 0, reason = ?, updated_at = ?"
                " WHERE node_id = ? AND attempt_id = ? AND wanted = 1",
                (reason, now, node_id, attempt_id),
            )
            return row is not None

        return await self.store.write(write)

    async def assignments(self, node_id: str) -> list[dict[str, Any]]:
        """The attempts the controller asked ``node_id`` to run, each with ``wanted`` and why."""
        rows = await self.store.read(
            lambda tx: tx.fetch_all(
                "SELECT * FROM node_assignments WHERE node_id = ? ORDER BY attempt_id", (node_id,)
            )
        )
        return [
            {**row, "wanted": bool(row["wanted"]), "inputs": json.loads(row["inputs"])}
            for row in rows
        ]

    async def give_up(self, node_id: str, attempt_id: str, *, reason: str = "given_up") -> bool:
        """Record that the controller no longer wants the attempt; return whether it knew it.

        Nothing is sent: a connected node's attempt is stopped with :meth:`stop`; a
        disconnected node's is stopped when it reconnects and reports it.
        """
        return await self._unwant(node_id, attempt_id, reason)

    async def reconcile(
        self,
        node_id: str,
        connection_id: str,
        reported: Sequence[dict[str, Any]],
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

        def write(tx: Transaction) -> Reconciliation:
            rows = {
                row["attempt_id"]: row
                for row in tx.fetch_all(
                    "SELECT * FROM node_assignments WHERE node_id = ?", (node_id,)
                )
            }
            adopted, stop = [], []
            for attempt in reported:
                fence = Fence(
                    attempt_id=attempt["attempt_id"],
                    generation=attempt["generation"],
                    plan_digest=attempt["plan_digest"],
                )
                row = rows.get(fence.attempt_id)
                if (
                    row is not None
                    and row["wanted"]
                    and (row["generation"], row["plan_digest"])
                    == (fence.generation, fence.plan_digest)
                ):
                    adopted.append(fence.attempt_id)
                else:
                    stop.append(fence)
            seen = {attempt["attempt_id"] for attempt in reported}
            missing = [
                attempt_id
                for attempt_id in known
                if attempt_id not in seen and attempt_id in rows and rows[attempt_id]["wanted"]
            ]
            for attempt_id in missing:
                tx.execute(
                    "UPDATE node_assignments SET wanted = 0, reason = 'not_reported',"
                    " updated_at = ? WHERE node_id = ? AND attempt_id = ?",
                    (now, node_id, attempt_id),
                )
            return Reconciliation(connection_id, tuple(adopted), tuple(stop), tuple(missing))

        result = await self.store.write(write)
        self.reconciled[node_id] = result
        return result

    # -- states --------------------------------------------------------------------------------

    def _unknown(self, tx: Transaction, node_id: str, now: float) -> None:
        placeholders = ", ".join("?" for _ in ENDED_STATES)
        tx.execute(
            "UPDATE node_attempts SET state = 'unknown', updated_at = ?"
            f" WHERE node_id = ? AND state NOT IN ({placeholders})",
            (now, node_id, *sorted(ENDED_STATES)),
        )
        tx.execute(
            "UPDATE node_assignments SET wanted = 0, reason = 'unknown', updated_at = ?"
            " WHERE node_id = ? AND wanted = 1",
            (now, node_id),
        )

    async def sweep(self) -> list[tuple[str, str]]:
        """Move silent nodes to unreachable or lost; return the ``(node, state)`` changes."""
        now = self.clock()

        def write(tx: Transaction) -> list[tuple[str, str]]:
            changes = []
            rows = tx.fetch_all(
                "SELECT id, state, last_heartbeat FROM nodes"
                " WHERE state IN ('connected', 'unreachable') AND last_heartbeat IS NOT NULL"
            )
            for row in rows:
                silent = now - row["last_heartbeat"]
                state = row["state"]
                if silent >= self.lost_after:
                    state = "lost"
                elif silent >= self.unreachable_after:
                    state = "unreachable"
                if state != row["state"]:
                    tx.execute("UPDATE nodes SET state = ? WHERE id = ?", (state, row["id"]))
                    if state == "lost":
                        self._unknown(tx, row["id"], now)
                    changes.append((row["id"], state))
            return changes

        return await self.store.write(write)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep node states on a short period until cancelled."""
        period = max(0.05, min(1.0, self.unreachable_after / 4))
        task_status.started()
        while True:
            await self.sweep()
            await trio.sleep(period)


def _input_digests(
    blobs: Mapping[str, int] | None,
    directories: Mapping[str, Mapping[str, tuple[str, int]]] | None,
) -> list[str]:
    """The hex digests a launch tells its node to stage (``sha256:`` prefixes dropped)."""
    digests = list(blobs or ())
    for files in (directories or {}).values():
        digests.extend(digest for digest, _size in files.values())
    return [digest.removeprefix("sha256:") for digest in digests]
