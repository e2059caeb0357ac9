"""The refusals about contributor nodes, each a class with its stable code."""

from __future__ import annotations

from typing import Any

from ..base.errors import Conflict, FiccError, NotFound, Unauthenticated


class ConnectionFenced(FiccError):
    """A newer connection of the same node replaced this one."""

    status = 409
    code = "connection_fenced"


class NodeNotFound(NotFound):
    """No contributor node has this ID."""

    code = "node_not_found"

    def __init__(self, node_id: str) -> None:
        super().__init__(f"no contributor node {node_id!r}", details={"id": node_id})


class NodeExists(Conflict):
    """A node of that name is already registered."""

    code = "node_exists"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"a node named {name!r} is already registered; revoke it first to re-issue",
            details={"name": name},
        )


class NodeUnavailable(Conflict):
    """The node takes no new work now, or is not connected to this controller."""

    code = "node_unavailable"


class NodeConnected(Conflict):
    """The node is connected (or only overdue): it may still run work, so it stays."""

    code = "node_connected"

    def __init__(self, node_id: str, state: str) -> None:
        why = "stop its agent" if state == "connected" else "it may reconnect"
        super().__init__(
            f"node {node_id} is {state}; {why} and wait until it is lost, or revoke it "
            f"first ('ficc admin revoke-node {node_id}'): only a lost, revoked or "
            "never-connected node can be removed",
            details={"node": node_id, "state": state},
        )


class NodeHasReplicas(Conflict):
    """Services still place replicas on the node, or have attempts there not released."""

    code = "node_has_replicas"

    def __init__(self, node_id: str, replicas: list[dict[str, Any]]) -> None:
        named = ", ".join(f"{r['alias']} replica {r['replica']}" for r in replicas[:5])
        more = f" and {len(replicas) - 5} more" if len(replicas) > 5 else ""
        super().__init__(
            f"node {node_id} still has {len(replicas)} replica(s) assigned ({named}{more}); "
            "move or remove them first",
            details={"node": node_id, "replicas": replicas},
        )


class InvalidNodeCredential(Unauthenticated):
    """The credential is not a valid node credential."""

    code = "invalid_node_credential"


class NodeCredentialRevoked(Unauthenticated):
    """The node's credential was revoked (``ficc admin revoke-node``)."""

    code = "credential_revoked"

    def __init__(self, node_id: str) -> None:
        super().__init__(f"the credential of node {node_id!r} has been revoked")
