"""The refusals about contributor nodes, each a class with its stable code."""

from __future__ import annotations

from ..errors import Conflict, FiccError, NotFound, Unauthenticated


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


class InvalidNodeCredential(Unauthenticated):
    """The credential is not a valid node credential."""

    code = "invalid_node_credential"


class NodeCredentialRevoked(Unauthenticated):
    """The node's credential was revoked (``ficc admin revoke-node``)."""

    code = "credential_revoked"

    def __init__(self, node_id: str) -> None:
        super().__init__(f"the credential of node {node_id!r} has been revoked")
