"""The activation channel: the gateway asks for an idle on-demand service to be woken,
the autoscaler answers.

The gateway holds requests to a service with no replica (:mod:`ficc_core.gateway.activation`)
and calls :meth:`ActivationChannel.activate`; the autoscaler
(:mod:`ficc_core.inference.scaling.autoscaler`) serves the channel when it is built. The
assembly builds one channel and hands it to both, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..base.errors import FiccError

#: Wakes one service: returns once its activation is recorded, raises its refusal.
Activate = Callable[[str], Awaitable[None]]


async def no_activation(service_id: str) -> None:
    """No autoscaler serves the channel (a gateway built alone): nothing can wake a
    service, and the request is told so."""
    raise FiccError(
        f"service {service_id!r} is idle and this controller cannot wake it",
        code="activation_failed",
        status=503,
        details={"service": service_id},
    )


class ActivationChannel:
    """Carries the gateway's wake-up calls to whoever serves them (see the module docs)."""

    def __init__(self) -> None:
        self._activate: Activate = no_activation

    def serve(self, activate: Activate | None) -> None:
        """Answer :meth:`activate` with ``activate`` from now on (None: nobody does)."""
        self._activate = no_activation if activate is None else activate

    async def activate(self, service_id: str) -> None:
        """Wake the idle on-demand service ``service_id``: returns once its activation is
        recorded (a replica is starting), raises its refusal (no capacity, a recent
        failure, or ``activation_failed`` when nothing serves the channel)."""
        await self._activate(service_id)


__all__ = ["Activate", "ActivationChannel", "no_activation"]
