"""What the usage package keeps in the store: the one usage record, and its summaries.

A :class:`UsageRecord` is what one invoke request used. The gateway's accounting makes
one per finished (or refused) request and hands it to its sinks (the
:class:`~ficc_core.usage.ledger.UsageLedger`); the same record is a row of
``inference_usage`` read back (:mod:`~ficc_core.usage.repository`), where a summary row
sums ``requests`` of them.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class UsageRecord:
    """One invoke request's usage (a row of ``inference_usage``), or a summary row of
    ``requests`` of them (their sums of tokens and cost, their mean times).

    :ivar credential_kind: the kind of the key that made it (the gateway's; not stored,
        so ``""`` in a record read back).
    :ivar outcome: ``ok``, ``cancelled`` (the client went away) or an error code.
    :ivar queue_wait: seconds waited for a replica slot.
    :ivar ttfb: seconds from admission to the first response byte, or None.
    :ivar duration: seconds from admission to the end.
    :ivar project_id: the project of the key that made it ("" for a personal key; the
        service's project is the service's).
    :ivar user_id: the person the key belongs to, if any.
    :ivar model: the registry model the service serves.
    :ivar cost: what it cost, in milli-units (:mod:`ficc_core.config.prices`).
    :ivar requests: how many requests the row sums (1 but for a summary row).
    """

    service_id: str
    generation: int
    replica: str
    node_id: str
    credential_id: str
    credential_kind: str = ""
    path: str
    status: int
    outcome: str
    prompt_tokens: int | None
    completion_tokens: int | None
    queue_wait: float
    ttfb: float | None
    duration: float
    finished_at: float
    project_id: str = ""
    user_id: str | None = None
    model: str = ""
    cost: int = 0
    requests: int = 1


def stored(attribute: attrs.Attribute[Any], value: Any) -> bool:
    """An :func:`attrs.asdict` filter: the fields a usage row has (all but
    ``credential_kind``), as the API shows a record."""
    return attribute.name != "credential_kind"


@attrs.frozen(kw_only=True)
class UsageTotals:
    """What a set of requests used."""

    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    mean_ttfb: float | None
    mean_duration: float | None
    cost: int = 0


@attrs.frozen(kw_only=True)
class CredentialUsage:
    """What one credential's requests used, with the credential's name and person."""

    credential_id: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int = 0
    cost: int = 0
    name: str | None = None
    username: str | None = None


@attrs.frozen(kw_only=True)
class UsageSummary:
    """Totals, per-credential totals and the latest requests of one service."""

    service_id: str
    since: float | None
    totals: UsageTotals
    alias: str | None = None
    by_credential: tuple[CredentialUsage, ...]
    recent: tuple[UsageRecord, ...]


__all__ = ["CredentialUsage", "UsageRecord", "UsageSummary", "UsageTotals", "stored"]
