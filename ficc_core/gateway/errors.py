"""The refusals of the inference gateway, each with a stable machine code.

They render as the one JSON error envelope (``{"error": {"code", "message",
"details"}}``), which the official OpenAI clients read (``error.message``). A
refusal a client may retry carries ``Retry-After``.
"""

from __future__ import annotations

from typing import Any

from ..base.errors import FiccError, Forbidden, NotFound

__all__ = [
    "ActivationTimeout",
    "CapabilityNotServed",
    "ContextLengthExceeded",
    "DeadlineExceeded",
    "EngineError",
    "EngineFailed",
    "EngineTimeout",
    "GatewayError",
    "GenerationChanged",
    "MaxOutputExceeded",
    "ModelNotFound",
    "NoReadyReplica",
    "NotForThisService",
    "OpenAIShaped",
    "ServerShuttingDown",
    "ServiceDraining",
    "ServiceNotFound",
    "ServiceSaturated",
    "ServiceStopped",
    "StreamInterrupted",
    "not_served_here",
    "shown_model",
]

#: Seconds a client is asked to wait before retrying a saturated or draining service.
RETRY_AFTER = 1


class GatewayError(FiccError):
    """Base class of the gateway's own refusals."""

    status = 502
    code = "gateway_error"


def _retry(kwargs: dict[str, Any], seconds: int = RETRY_AFTER) -> dict[str, Any]:
    headers = dict(kwargs.pop("headers", None) or {})
    headers.setdefault("Retry-After", str(seconds))
    return {**kwargs, "headers": headers}


class ServiceNotFound(NotFound):
    """No published service with this ID in the caller's project."""

    code = "service_not_found"


class NotForThisService(Forbidden):
    """A service-bound invoke credential was presented for another service."""

    code = "credential_not_for_service"


class ModelNotFound(NotFound):
    """The request names a model other than the service's alias."""

    code = "model_not_found"


#: The most of a client's model name a refusal repeats (no name FICC accepts is over 64).
MODEL_SHOWN = 128


def shown_model(model: str) -> str:
    """``model`` as a refusal repeats it: whole, unless longer than any name could be (then
    its start and ``...``), so a refusal never sends a client's megabyte back to it."""
    return model if len(model) <= MODEL_SHOWN else model[: MODEL_SHOWN - 3] + "..."


def not_served_here(model: str, served: str) -> ModelNotFound:
    """A service's own route refusing ``model``, a name other than its alias ``served``."""
    shown = shown_model(model)
    return ModelNotFound(
        f"The model `{shown}` does not exist: this service serves `{served}`",
        details={"model": shown, "served": served},
    )


class CapabilityNotServed(NotFound):
    """The route needs a capability the service's engine does not serve (embeddings)."""

    code = "capability_not_served"


class ServiceDraining(GatewayError):
    """The service is draining: in-flight requests finish, new ones are refused."""

    status = 503
    code = "service_draining"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **_retry(kwargs))


class ServiceStopped(GatewayError):
    """The service is stopped (or stopped while the response streamed)."""

    status = 503
    code = "service_stopped"


class ServiceSaturated(GatewayError):
    """Every replica is at its concurrency and the wait queue is full."""

    status = 429
    code = "service_saturated"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **_retry(kwargs))


class NoReadyReplica(GatewayError):
    """No ready replica could take the request (none ready, all failed, or waited too long)."""

    status = 503
    code = "no_ready_replica"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **_retry(kwargs))


class ActivationTimeout(GatewayError):
    """An idle on-demand service did not load within ``activation_wait`` (or the request
    deadline, when sooner). Sent with ``Retry-After`` (the ``activation_retry`` setting)."""

    status = 503
    code = "activation_timeout"


class GenerationChanged(GatewayError):
    """A new generation of the service was published while the response streamed."""

    status = 503
    code = "service_generation_changed"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **_retry(kwargs))


class ServerShuttingDown(GatewayError):
    """The controller is shutting down and its grace period ended before the response did."""

    status = 503
    code = "server_shutting_down"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **_retry(kwargs))


class DeadlineExceeded(GatewayError):
    """The request ran past the service's request deadline."""

    status = 504
    code = "deadline_exceeded"


class EngineFailed(GatewayError):
    """The engine's stream failed after it answered (no replay happens then)."""

    status = 502
    code = "engine_failed"


class ReplicaUnresponsive(EngineFailed):
    """The request's replica stopped answering its liveness probes and left routing
    while the request was on it. Before anything reached the client another replica is
    tried; after, a stream ends with this as its last event."""

    status = 503
    code = "replica_unresponsive"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **_retry(kwargs))


class StreamInterrupted(GatewayError):
    """A non-streamed response was cut after its first bytes reached the client."""

    status = 502
    code = "stream_interrupted"


class EngineTimeout(GatewayError):
    """The engine did not answer within one of the gateway's bounds (``timeout_*``).

    Before anything reached the client another replica is tried first; this is what
    the client gets when none answered in time, or when a stream stalls after it
    started (then as its last SSE event).
    """

    status = 504
    code = "engine_timeout"

    def __init__(self, bound: str, seconds: float, what: str, **kwargs: Any) -> None:
        details = {"bound": bound, "seconds": seconds, **(kwargs.pop("details", None) or {})}
        super().__init__(
            f"the engine did not {what} within {seconds:g} s ({bound})", details=details, **kwargs
        )
        self.bound = bound


class OpenAIShaped(GatewayError):
    """A refusal rendered as an OpenAI error object: the envelope with ``type`` and ``param``.

    ``type`` is ``invalid_request_error`` for a 4xx and ``server_error`` for a 5xx.
    """

    def __init__(self, message: str, *, param: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.param = param

    @property
    def type(self) -> str:
        """OpenAI's error ``type`` for this status."""
        return "invalid_request_error" if self.status < 500 else "server_error"

    def envelope(self) -> dict[str, Any]:
        """The one envelope, with OpenAI's ``type`` and ``param`` beside the string code."""
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "details": self.details,
            }
        }


class EngineError(OpenAIShaped):
    """The engine's own error answer, re-shaped as an OpenAI error object in the envelope.

    ``code`` is a string (``context_length_exceeded``, else ``engine_error``); the
    engine's status, numeric code and type are in ``details`` (``engine_status``,
    ``engine_code``, ``engine_type``).
    """

    code = "engine_error"


class ContextLengthExceeded(OpenAIShaped):
    """The prompt and the completion asked for certainly do not fit the service's context."""

    status = 400
    code = "context_length_exceeded"


class MaxOutputExceeded(OpenAIShaped):
    """``max_tokens`` (or ``max_completion_tokens``) asks more than the service's ``max_output``."""

    status = 400
    code = "max_output_exceeded"
