"""Managed inference services: what operators ask of a service, and the nodes made to run it.

:mod:`.manager` takes operators' requests; :mod:`.specification` checks and places a
specification, :mod:`.scaling` decides which placements run, :mod:`.reconciliation` drives
attempts on the nodes towards that, :mod:`.operations` records rollouts, restarts and moves;
:mod:`.records`, :mod:`.repository` and :mod:`.history` are the records, SQL and events all
of them share.

Other packages go through :class:`InferenceManager`, except for the few reads they
compose into a transaction of their own, offered here (the rest of :mod:`.repository`
is this package's): :func:`service`, which a share's check reads in the people
transaction it guards, and :func:`service_ids` with :func:`attempts`, which a standby's
routing follower reads with every service's rollout in one snapshot.
"""

from .errors import PlacementFailed, StaleRevision, UnknownOutcome
from .manager import CONTROL_ACTIONS, InferenceManager, Preview
from .reconciliation.reconciler import Reconciler
from .records import AttemptState, Desired, ServiceDetail, ServiceState
from .repository import attempts, service, service_ids
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
    "attempts",
    "service",
    "service_ids",
]
