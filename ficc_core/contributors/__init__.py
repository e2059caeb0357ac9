"""Contributors: the nodes that run engines for the controller (embedded or remote)."""

from .registry import (
    NODE_STATES,
    NODE_TOKEN_PREFIX,
    ConnectionFenced,
    NodeRegistry,
    Reconciliation,
    is_node_token,
)

__all__ = [
    "NODE_STATES",
    "NODE_TOKEN_PREFIX",
    "ConnectionFenced",
    "NodeRegistry",
    "Reconciliation",
    "is_node_token",
]
