"""``GET /api/v1/usage``: requests, errors by code, tokens, spend and latency (docs/usage.md).

Filters: ``service`` (ID or alias), ``key`` (credential ID), ``person`` (user ID or
username), ``project`` (ID or name), ``model`` (ID or name), ``since``/``until``
(seconds since the epoch) or ``period`` (``day``, ``month`` or a duration such as
``15m`` ending now); ``group_by`` names one or more of service, key, person, project,
model (comma-separated). An administrator sees every request; a project principal
its project's (its keys' and its services'); a personal key its person's personal
requests. ``GET /api/v1/me/usage`` is any person's own personal usage.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from quart import Response, g, jsonify, request

from ..auth import scopes as s
from ..base.errors import Forbidden
from ..config.prices import MILLI
from ..usage.report import GROUPS, UsageGroup, UsageQuery, UsageReport, period_start
from .access import route
from .bodies import bad_query, query_number

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service

#: The longest filter value accepted (IDs and names are far shorter).
MAX_FILTER = 200
_FILTERS = ("service", "key", "person", "project", "model")


def _text(name: str) -> str | None:
    raw = request.args.get(name)
    if raw is None:
        return None
    if not raw or len(raw) > MAX_FILTER or not raw.isprintable():
        raise bad_query(name, f"expected 1 to {MAX_FILTER} printable characters")
    return raw


def parse_query(now: float, person: str | None = None) -> UsageQuery:
    """The :class:`UsageQuery` of this request's query string, scoped to its principal
    (or, given ``person``, to that person's personal requests)."""
    principal = g.principal
    since, until, period = query_number("since"), query_number("until"), _text("period")
    if period is not None:
        if since is not None:
            raise bad_query("period", "give period or since, not both")
        since = period_start(period, now)
        if since is not None:
            since = max(0.0, since)  # a duration longer than the epoch is "since ever"
        if since is None:
            raise bad_query("period", "expected day, month or a duration such as 15m, 12h, 7d")
    group_by: tuple[str, ...] = ()
    raw_groups = _text("group_by")
    if raw_groups is not None:
        group_by = tuple(dict.fromkeys(part.strip() for part in raw_groups.split(",")))
        unknown = [name for name in group_by if name not in GROUPS]
        if unknown:
            raise bad_query("group_by", f"expected some of {', '.join(GROUPS)}, got {unknown[0]!r}")
    admin = s.ADMIN in principal.scopes and person is None
    scope_project: str | None
    scope_person: str | None
    if person is not None:
        scope_project, scope_person = None, person
    else:
        scope_project = None if admin or principal.personal else principal.project_id
        scope_person = (principal.user_id or "") if principal.personal and not admin else None
    return UsageQuery(
        since=since,
        until=until,
        group_by=group_by,
        **{name: _text(name) for name in _FILTERS},
        scope_project=scope_project,
        scope_person=scope_person,
    )


def group_view(group: UsageGroup) -> dict[str, Any]:
    """One group's (or the totals') usage as JSON; spend in units and exact milli-units."""
    return {
        **group.key,
        "requests": group.requests,
        "errors": sum(group.errors.values()),
        "errors_by_code": group.errors,
        "prompt_tokens": group.prompt_tokens,
        "completion_tokens": group.completion_tokens,
        "spend": group.cost / MILLI,
        "spend_milli": group.cost,
        "latency": group.latency,
    }


def report_view(report: UsageReport) -> dict[str, Any]:
    """The report as JSON: the selection, its totals and its groups."""
    query = report.query
    return {
        "since": query.since,
        "until": query.until,
        "filters": {name: getattr(query, name) for name in _FILTERS if getattr(query, name)},
        "group_by": list(query.group_by),
        "totals": group_view(report.totals),
        "groups": [group_view(group) for group in report.groups],
    }


def register(app: QuartTrio, service: Service) -> None:
    """Add the usage route to ``app``."""

    @route(app, "usage_report")
    async def usage_report() -> Response:
        query = parse_query(time.time())
        return jsonify(report_view(await service.usage.report(query)))

    @route(app, "me_usage")
    async def me_usage() -> Response:
        principal = g.principal
        if principal.user_id is None:
            raise Forbidden(
                "this credential belongs to no person: log in, or use a credential of yours",
                code="no_person",
            )
        query = parse_query(time.time(), person=principal.user_id)
        return jsonify(report_view(await service.usage.report(query)))
