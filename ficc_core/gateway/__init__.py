"""The inference gateway: the one seam every invoke path (HTTP, federation) goes through.

:mod:`.gateway` runs a request through the concerns beside it: :mod:`.checks`
(authority, admission, the body), :mod:`.activation` (waking an idle on-demand
service, the bounded wait for it), :mod:`.admission` (replica slots, the wait
queue), :mod:`.relay` (the engine's stream, the response), :mod:`.accounting`
(usage records, metrics), :mod:`.breakers` (replicas out for a cooldown),
:mod:`.limits` (context and output refusal) and :mod:`.engine_errors` (an
engine's error as an OpenAI error object); :mod:`.request` is the state they
share and :mod:`.errors` the refusals. :mod:`.project` serves the project endpoint
(one base URL, the service named by ``model``, fallbacks) through the same seam,
:mod:`.catalog` resolving names and writing ``/v1/models``.
"""

from __future__ import annotations

from .errors import (
    ActivationTimeout,
    CapabilityNotServed,
    ContextLengthExceeded,
    DeadlineExceeded,
    EngineError,
    EngineFailed,
    EngineTimeout,
    GatewayError,
    GenerationChanged,
    MaxOutputExceeded,
    ModelNotFound,
    NoReadyReplica,
    NotForThisService,
    ServiceDraining,
    ServiceNotFound,
    ServiceSaturated,
    ServiceStopped,
    StreamInterrupted,
)
from .gateway import MODEL_PREFIX, PATHS, Gateway
from .project import ProjectEndpoint, Served
from .relay import ResponseChunks

__all__ = [
    "MODEL_PREFIX",
    "PATHS",
    "ActivationTimeout",
    "CapabilityNotServed",
    "ContextLengthExceeded",
    "DeadlineExceeded",
    "EngineError",
    "EngineFailed",
    "EngineTimeout",
    "Gateway",
    "GatewayError",
    "GenerationChanged",
    "MaxOutputExceeded",
    "ModelNotFound",
    "NoReadyReplica",
    "NotForThisService",
    "ProjectEndpoint",
    "ResponseChunks",
    "Served",
    "ServiceDraining",
    "ServiceNotFound",
    "ServiceSaturated",
    "ServiceStopped",
    "StreamInterrupted",
]
