"""Inference replicas (docs/inference.md): draining, retries, readiness."""

from __future__ import annotations

import attrs

from .fields import setting


@attrs.frozen(slots=False)
class InferenceSettings:
    """Inference replicas' lifecycle (a section of Config)."""

    drain_timeout: float = setting(
        30.0,
        "How long a draining inference service lets in-flight requests finish before it "
        "stops (duration).",
        kind="duration",
    )
    replica_retry_max: float = setting(
        30.0,
        "The longest wait between attempts to start a failed inference replica; waits double "
        "from one second up to this (duration).",
        kind="duration",
    )
    replica_give_up_after: int = setting(
        3,
        "After this many attempts in a row of an inference replica fail the same way (same "
        "reason, such as memory_limit), the replica stops retrying and the service shows that "
        "reason until it is started again; 0 retries forever.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    replica_ready_timeout: float = setting(
        600.0,
        "How long a move waits for its target replica, a restart for each replacement and "
        "a rollout for its new generation to become ready before it gives up and leaves "
        "the serving replicas as they were (duration).",
        kind="duration",
    )
