"""Contributors: the nodes that run engines for the controller (embedded or remote).

Other packages go through :class:`NodeRegistry`, except for the few statements they
compose into a transaction of their own, offered here (the rest of :mod:`.repository`
is this package's): :func:`fetch_node` and :func:`list_nodes`, the nodes that inference's
placement, moves and status read beside its own tables, and :func:`set_unwanted`, which
marks an attempt's assignment unwanted in the transaction that gives it up.
"""

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
from .repository import fetch_node, list_nodes, set_unwanted

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
    "fetch_node",
    "is_node_token",
    "list_nodes",
    "set_unwanted",
]
