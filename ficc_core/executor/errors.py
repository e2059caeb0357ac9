"""The refusals an executor provider makes, each with a stable machine code.

Every error here is a :class:`ficc_core.base.errors.FiccError`, so the API and the
agent report it in the one JSON error envelope.
"""

from __future__ import annotations

from ..base.errors import FiccError

__all__ = [
    "AttemptExists",
    "EngineUnavailable",
    "ExecutorError",
    "ImageDigestMismatch",
    "InputNotAdmitted",
    "IsolationUnavailable",
    "LaunchFailed",
    "PathNotAdmitted",
    "PayloadTooLarge",
    "RuntimeDirUnusable",
    "StaleFence",
    "StreamExists",
    "TooManyStreams",
    "UnknownAttempt",
    "UnknownStream",
]


class ExecutorError(FiccError):
    """Base class of every executor refusal."""

    status = 500
    code = "executor_error"


class StaleFence(ExecutorError):
    """The fence names a known attempt but another generation or plan digest."""

    status = 409
    code = "stale_fence"


class UnknownAttempt(ExecutorError):
    """No attempt with the fence's attempt ID runs on this executor."""

    status = 404
    code = "unknown_attempt"


class AttemptExists(ExecutorError):
    """An attempt with this ID was already launched here."""

    status = 409
    code = "attempt_exists"


class UnknownStream(ExecutorError):
    """The stream ID is not open on this attempt (never opened, ended, cancelled or expired)."""

    status = 404
    code = "unknown_stream"


class StreamExists(ExecutorError):
    """A stream with this ID is already open on this attempt."""

    status = 409
    code = "stream_exists"


class TooManyStreams(ExecutorError):
    """The attempt already has as many open streams as the executor allows."""

    status = 429
    code = "too_many_streams"


class PathNotAdmitted(ExecutorError):
    """The request path (or method) is not in the job's endpoint contract."""

    status = 403
    code = "path_not_admitted"


class PayloadTooLarge(PathNotAdmitted):
    """The request body is larger than the endpoint action relays."""

    status = 413
    code = "payload_too_large"


class InputNotAdmitted(ExecutorError):
    """The upload names an input the job did not admit, or one that is not a file."""

    status = 403
    code = "input_not_admitted"


class EngineUnavailable(ExecutorError):
    """The engine is not ready, has exited, or refused the connection."""

    status = 503
    code = "engine_unavailable"


class IsolationUnavailable(ExecutorError):
    """The executor cannot ensure network isolation on this host; it refuses to launch."""

    status = 503
    code = "isolation_unavailable"


class ImageDigestMismatch(ExecutorError):
    """The local runtime image does not have the digest the runtime pins."""

    status = 409
    code = "image_digest_mismatch"


class LaunchFailed(ExecutorError):
    """The executor could not start the engine."""

    status = 500
    code = "launch_failed"


class RuntimeDirUnusable(LaunchFailed):
    """The runtime directory (engine sockets) is too long for a Unix socket path, not a
    private directory of this user, or cannot be created; ``details.setting`` names the
    setting that fixes it."""

    code = "runtime_dir_unusable"
