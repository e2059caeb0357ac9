"""Contributors: the nodes that run engines for the controller (embedded or remote)."""

from .assignments import Reconciliation
from .credentials import NODE_TOKEN_PREFIX, is_node_token
from .errors import (
    ConnectionFenced,
    InvalidNodeCredential,
    NodeConnected,
    NodeCredentialRevoked,
    NodeExists,
    NodeHasReplicas,
    NodeNotFound,
    NodeUnavailable,
)
from .records import (
    Assignment,
    AssignmentReason,
    GpuShare,
    Node,
    NodeAttempt,
    NodeAttemptState,
    NodeReservation,
    NodeState,
)
from .registry import NodeRegistry

__all__ = [
    "NODE_TOKEN_PREFIX",
    "Assignment",
    "AssignmentReason",
    "ConnectionFenced",
    "GpuShare",
    "InvalidNodeCredential",
    "Node",
    "NodeAttempt",
    "NodeAttemptState",
    "NodeConnected",
    "NodeCredentialRevoked",
    "NodeExists",
    "NodeHasReplicas",
    "NodeNotFound",
    "NodeRegistry",
    "NodeReservation",
    "NodeState",
    "NodeUnavailable",
    "Reconciliation",
    "is_node_token",
]
