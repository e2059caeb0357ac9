"""The project endpoint: one OpenAI base URL for every service a credential may invoke.

A request names its service by ``model`` (:class:`~.catalog.Catalog` resolves it
among the services the credential may invoke) and is then served exactly as the
per-service route serves it, through :meth:`Gateway.invoke` with the body's
``model`` set to that service's alias: the same checks, admission, relay and
accounting. ``GET /v1/models`` lists those services, and ``GET /v1/models/{model}``
answers the entry of the one ``model`` reaches.

**Fallbacks.** When the service the name reaches cannot take the request before
any response exists (:data:`FALLBACK_CODES`: stopped, draining, no ready replica
(none ready, every replica failed before its response head, no slot freed in
time), saturated) or its engines failed before any response existed (timed out,
broke off, answered 5xx: :func:`falls_back`), or it is an idle on-demand service
whose activation failed or did not finish within ``activation_wait``
(:mod:`.activation`; an idle service is woken, not skipped), the aliases its specification lists
in ``fallbacks`` are tried in order, each through :meth:`Gateway.invoke` like the
first. Only the first service's fallbacks are followed (no chains, hence no
loops), and only those the credential may invoke: a service-bound credential
reaches one service, so it has none. The response carries the service that
answered (:class:`Served`; the route sends it as ``x-ficc-service``); its usage
record and metrics are that service's, and ``ficc_gateway_fallbacks`` counts it.
When every one refused, the refusal is the first service's, with each attempt in
``details.attempts``. Any other refusal (the body, authority, a deadline, an
engine failing after its head) is the answer as it is: another service would not
change it, or the response exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ..base.errors import FiccError, InvalidRequest
from .activation import activation_refusal
from .catalog import Catalog
from .checks import model_not_a_string
from .errors import EngineError
from .gateway import MODEL_PREFIX, MODEL_ROUTE, NO_HEADERS, method_of
from .relay import ResponseChunks

if TYPE_CHECKING:
    from ..auth import Principal
    from ..routing.live import LiveService
    from .gateway import Gateway

__all__ = ["FALLBACK_CODES", "ProjectEndpoint", "Served"]

#: The refusals of a service that send a project-endpoint request to its fallbacks:
#: it cannot serve, or its engines failed before any response existed (every replica
#: tried timed out, broke off before its first bytes, or answered with a 5xx).
FALLBACK_CODES = frozenset(
    {
        "service_stopped",
        "service_draining",
        "no_ready_replica",
        "service_saturated",
        "engine_timeout",
        "engine_failed",
    }
)


def falls_back(refusal: FiccError) -> bool:
    """Whether ``refusal`` of one service sends the request on to its fallbacks."""
    return (
        refusal.code in FALLBACK_CODES
        or (isinstance(refusal, EngineError) and refusal.status >= 500)
        or activation_refusal(refusal)
    )


@attrs.frozen
class Served:
    """A project-endpoint response: the engine's status, the response, who answered.

    :ivar service: the service that answered (None for ``/v1/models``).
    """

    status: int
    response: ResponseChunks
    service: LiveService | None = None


def _missing_model() -> InvalidRequest:
    return InvalidRequest(
        "the project endpoint routes by `model`: name one of the models /v1/models lists",
        details={"errors": [{"path": "$.model", "message": "expected string"}]},
    )


def _exhausted(failures: list[tuple[LiveService, FiccError]]) -> FiccError:
    """The refusal once the service and each of its fallbacks refused: the first's, with
    every attempt in ``details.attempts``."""
    first = failures[0][1]
    tried = ", ".join(f"{v.alias} ({e.code})" for v, e in failures[1:])
    return FiccError(
        f"{first.message}; its fallbacks could not serve either: {tried}",
        code=first.code,
        status=first.status,
        details={
            **first.details,
            "attempts": [
                {"service": v.alias, "code": e.code, "message": e.message} for v, e in failures
            ],
        },
        headers=first.headers,
    )


class ProjectEndpoint:
    """Serves the project endpoint's routes through ``gateway`` (see the module docs)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.catalog = Catalog(gateway.live)

    async def invoke(
        self,
        path: str,
        body: bytes | Mapping[str, Any],
        actor: Principal,
        headers: Mapping[str, str] = NO_HEADERS,
    ) -> Served:
        """Serve ``actor``'s request to ``path`` of the service its ``model`` names.

        Returns the :class:`Served` response, which the caller must close; raises the
        refusal (a :class:`FiccError`) made before a response exists.
        """
        gateway = self.gateway
        method_of(path)
        try:
            gateway.checks.may_invoke(actor)
            if path == "/v1/models":
                listing = self.catalog.listing(actor)
                return Served(
                    200,
                    ResponseChunks(status=200, content_type="application/json", pending=[listing]),
                )
            if path.startswith(MODEL_PREFIX):
                entry = self.catalog.entry(actor, path[len(MODEL_PREFIX) :])
                return Served(
                    200,
                    ResponseChunks(status=200, content_type="application/json", pending=[entry]),
                )
            # Parsed once: each candidate prepares the same body for its own alias.
            parsed = gateway.checks.parse(body)
            model = parsed.model
            if not isinstance(model, str):
                raise _missing_model() if model is None else model_not_a_string(model)
            first = self.catalog.resolve(actor, model)
        except FiccError as exc:
            # A model's path is recorded as its route: a client must not mint paths.
            recorded = MODEL_ROUTE if path.startswith(MODEL_PREFIX) else path
            gateway.accounting.refused("", exc.code, actor, recorded, exc.status)
            raise
        candidates = [first, *self.catalog.fallbacks(actor, first)]
        failures: list[tuple[LiveService, FiccError]] = []
        for view in candidates:
            # The client's bytes are sent as they are when they name the alias; else the
            # document, renamed (never parsed again).
            payload = parsed.for_model(view.alias)
            try:
                status, response = await gateway.invoke(view.id, path, payload, actor, headers)
            except FiccError as exc:
                if not falls_back(exc):
                    raise
                failures.append((view, exc))
                continue
            if status == 503 and view is not candidates[-1]:
                await response.aclose()
                failures.append(
                    (
                        view,
                        FiccError("the engine answered 503", code="engine_unavailable", status=503),
                    )
                )
                continue
            if view is not first:
                gateway.accounting.metrics.gateway_fallbacks.labels(first.id, view.id).inc()
            return Served(status, response, view)
        if len(failures) == 1:
            raise failures[0][1]
        raise _exhausted(failures)
