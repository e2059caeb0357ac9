"""On-demand services in the reconciler's step: where one stands, and a failed activation.

A scaled service with ``min = 0`` (and not pinned) is published ``idle`` while no
placement is active, ``activating`` while its woken replica loads, and ``failed``
(with the reason) for ``activation_retry`` seconds after the woken replica failed:
:meth:`OnDemand.failed` puts it back to idle in that case, so every request waiting
for it hears the reason at once and the broken engine is not retried until a
request comes again (docs/inference.md, "Scaling").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...routing.demand import RETURN_MARGIN, retry_after, retry_window
from ...routing.live import Activation
from ...store import Transaction
from .. import repository
from ..records import AttemptRecord, AttemptState, ServiceRecord
from ..scaling import changes
from ..scaling.activations import ActivationNotes, Failure
from ..specification.replicas import on_demand
from .publication import latest

if TYPE_CHECKING:
    from ...schema import Specification
    from ...store import Store
    from ..scaling.metrics import ScalingMetrics

log = logging.getLogger("ficc.inference")


class OnDemand:
    """The reconciler's view of its on-demand services (see the module docs)."""

    def __init__(
        self,
        store: Store,
        activations: ActivationNotes,
        clock: Callable[[], float],
        metrics: ScalingMetrics | None = None,
    ):
        self.store = store
        self.activations = activations
        self.clock = clock
        #: Counts a failed activation in the scaling series (None: not counted).
        self.metrics = metrics

    def activation(
        self, record: ServiceRecord, specification: Specification, wanted: tuple[int, ...] | None
    ) -> tuple[Activation, Failure | None]:
        """Where an on-demand service stands (``""`` for any other), and its recent failure."""
        if wanted is None or not on_demand(specification, record.pinned):
            return "", None
        failure = self.activations.recent(record.id)
        if wanted:
            return "activating", None  # ("" once a replica is routed: publish says so)
        return ("idle", None) if failure is None else ("failed", failure)

    def idle_reason(self, record: ServiceRecord) -> str:
        failure = self.activations.recent(record.id)
        if failure is not None:
            return f"idle: the last activation failed ({failure.message}); a request tries again"
        return "idle: no replica runs until a request comes; the next request wakes it"

    async def failed(
        self,
        record: ServiceRecord,
        specification: Specification,
        attempts: Sequence[AttemptRecord],
        runs: tuple[int, ...],
    ) -> bool:
        """An on-demand service whose woken replicas all failed since it was woken goes
        back to idle with the reason noted, so every waiting request hears it at once
        (the replica is not retried until a request comes again)."""
        if not runs or not on_demand(specification, record.pinned):
            return False
        # Since it was woken (a database from before woken_at: its last decision).
        since = record.woken_at if record.woken_at is not None else record.scaled_at or 0.0
        newest = latest(attempts, record.generation)
        failed = [newest.get(i) for i in runs]
        if not all(
            a is not None and a.state == AttemptState.FAILED and a.created_at >= since
            for a in failed
        ):
            return False
        last = failed[-1]
        assert last is not None
        message = (
            f"replica {last.replica} failed to "
            + ("load" if last.ready_at is None else "keep serving")
            + f" ({last.reason})"
            + (f": {last.message}" if last.message else "")
        )
        now = self.clock()

        def write(tx: Transaction) -> None:
            current = repository.service(tx, record.id)
            if current is None or current.revision < record.revision:
                return
            for index in runs:
                changes.shrink(
                    tx,
                    current,
                    index,
                    reason="activation_failed",
                    now=now,
                    message=f"the activation failed: {message}; the service is idle again",
                    figures={"attempt_reason": last.reason},
                )
                current = repository.service(tx, record.id)
                assert current is not None

        self.activations.failed(
            record.id,
            "activation_failed",
            message,
            {"replica": last.replica, "attempt_reason": last.reason},
        )
        await self.store.write(write)
        if self.metrics is not None:
            self.metrics.activations.labels(record.id, "failed").inc()
            self.metrics.scaling_decisions.labels(record.id, "in", "activation_failed").inc()
        log.warning("service %s: activation failed: %s", record.id, message)
        return True


def retry_warning(
    specification: Specification, *, idle_timeout: float, activation_retry: float
) -> dict[str, Any] | None:
    """An ``idle_timeout_below_retry_window`` preview warning for an on-demand service
    whose idle timeout (``idle_timeout``: the setting, when it names none) is shorter than
    the activation retry window (``Retry-After`` and the margin for the retry to come):
    a replica woken by requests that timed out stays up that long anyway, so the idle
    timeout is not what stops it then."""
    scaling = specification.scaling
    if scaling is None or scaling.min > 0:
        return None
    seconds = scaling.idle_timeout or idle_timeout
    window = retry_window(activation_retry)
    if seconds >= window:
        return None
    return {
        "code": "idle_timeout_below_retry_window",
        "message": f"idle_timeout ({seconds:g} s) is shorter than the activation retry window "
        f"({window:g} s: Retry-After {retry_after(activation_retry)} s and {RETURN_MARGIN:g} s "
        "for the retry to come): a replica woken by requests that timed out stays up that "
        "long, whatever idle_timeout says; idle timeouts of minutes keep the KV cache worth "
        "having",
        "details": {
            "idle_timeout": seconds,
            "retry_window": window,
            "path": "$.scaling.idle_timeout",
        },
    }


__all__ = ["OnDemand", "retry_warning"]
