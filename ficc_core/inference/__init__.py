"""Managed inference services: specification, placement, revisions, reconciliation."""

from .live import LiveReplica, LiveService, LiveTable
from .manager import (
    CONTROL_ACTIONS,
    ControlBody,
    InferenceManager,
    PlacementFailed,
    ReplaceBody,
    StaleRevision,
    TokenBody,
    UnknownOutcome,
)
from .reconciler import Reconciler

__all__ = [
    "CONTROL_ACTIONS",
    "ControlBody",
    "InferenceManager",
    "LiveReplica",
    "LiveService",
    "LiveTable",
    "PlacementFailed",
    "Reconciler",
    "ReplaceBody",
    "StaleRevision",
    "TokenBody",
    "UnknownOutcome",
]
