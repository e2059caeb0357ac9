"""Managed inference services: specification, placement, revisions, reconciliation."""

from .errors import PlacementFailed, StaleRevision, UnknownOutcome
from .manager import CONTROL_ACTIONS, InferenceManager, Preview
from .reconciliation.reconciler import Reconciler
from .records import AttemptState, Desired, ServiceDetail, ServiceState
from .specification.model_context import ModelContext, ModelContexts

__all__ = [
    "CONTROL_ACTIONS",
    "AttemptState",
    "Desired",
    "InferenceManager",
    "ModelContext",
    "ModelContexts",
    "PlacementFailed",
    "Preview",
    "Reconciler",
    "ServiceDetail",
    "ServiceState",
    "StaleRevision",
    "UnknownOutcome",
]
