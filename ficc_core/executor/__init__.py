"""What executor providers share: the provider protocol, errors, the endpoint action, logs.

Providers (``ficc-executor-process``, ``ficc-executor-container`` and third-party
ones) import these names from ``ficc_core``.
"""

from .attempts import ExecutorAttempt, attempt_key
from .base import SupervisingProvider
from .endpoint import (
    ALLOWED_REQUEST_HEADERS,
    CHUNK_SIZE,
    QUEUE_CHUNKS,
    EndpointStreams,
    check_fence,
)
from .errors import (
    AttemptExists,
    EngineUnavailable,
    ExecutorError,
    ImageDigestMismatch,
    InputNotAdmitted,
    IsolationUnavailable,
    LaunchFailed,
    PathNotAdmitted,
    PayloadTooLarge,
    StaleFence,
    StreamExists,
    TooManyStreams,
    UnknownAttempt,
    UnknownStream,
)
from .logs import BoundedLog
from .node import measure_resources, package_digest, total_memory
from .protocol import EndpointAction, ExecutorProvider, Headers
from .types import (
    AttemptState,
    AttemptStatus,
    BodyChunk,
    EndOfStream,
    ReadEvent,
    ResponseHead,
    StreamFailed,
)
from .watchdog_helper import process_start_time

__all__ = [
    "ALLOWED_REQUEST_HEADERS",
    "CHUNK_SIZE",
    "QUEUE_CHUNKS",
    "AttemptExists",
    "AttemptState",
    "AttemptStatus",
    "BodyChunk",
    "BoundedLog",
    "EndOfStream",
    "EndpointAction",
    "EndpointStreams",
    "EngineUnavailable",
    "ExecutorAttempt",
    "ExecutorError",
    "ExecutorProvider",
    "Headers",
    "ImageDigestMismatch",
    "InputNotAdmitted",
    "IsolationUnavailable",
    "LaunchFailed",
    "PathNotAdmitted",
    "PayloadTooLarge",
    "ReadEvent",
    "ResponseHead",
    "StaleFence",
    "StreamExists",
    "StreamFailed",
    "SupervisingProvider",
    "TooManyStreams",
    "UnknownAttempt",
    "UnknownStream",
    "attempt_key",
    "check_fence",
    "measure_resources",
    "package_digest",
    "process_start_time",
    "total_memory",
]
