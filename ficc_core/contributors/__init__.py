"""Contributors: the nodes that run engines for the controller (embedded or remote)."""

from .link import NodeEndpoint
from .registry import (
    NODE_STATES,
    NODE_TOKEN_PREFIX,
    ConnectionFenced,
    NodeRegistry,
    Reconciliation,
    is_node_token,
)
from .relay import RelayEndpoint

__all__ = [
    "NODE_STATES",
    "NODE_TOKEN_PREFIX",
    "ConnectionFenced",
    "NodeEndpoint",
    "NodeRegistry",
    "Reconciliation",
    "RelayEndpoint",
    "is_node_token",
]
