"""The inference gateway: the one seam every invoke path (HTTP, federation) goes through."""

from __future__ import annotations

from .errors import (
    CapabilityNotServed,
    DeadlineExceeded,
    EngineFailed,
    GatewayError,
    GenerationChanged,
    ModelNotFound,
    NoReadyReplica,
    NotForThisService,
    ServiceDraining,
    ServiceNotFound,
    ServiceSaturated,
    ServiceStopped,
    StreamInterrupted,
)
from .gateway import PATHS, Gateway, ResponseChunks, UsageRecord

__all__ = [
    "PATHS",
    "CapabilityNotServed",
    "DeadlineExceeded",
    "EngineFailed",
    "Gateway",
    "GatewayError",
    "GenerationChanged",
    "ModelNotFound",
    "NoReadyReplica",
    "NotForThisService",
    "ResponseChunks",
    "ServiceDraining",
    "ServiceNotFound",
    "ServiceSaturated",
    "ServiceStopped",
    "StreamInterrupted",
    "UsageRecord",
]
