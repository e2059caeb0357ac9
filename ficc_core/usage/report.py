"""Usage you can read: requests, errors by code, tokens, spend and latency, filtered and grouped.

:func:`usage_report` runs in one read transaction (the store's worker thread) over
``inference_usage``: its SQL lives here, beside the records it returns, as
:mod:`.repository` holds the package's other statements. A row may sum several
requests (``requests``: the ledger folds records into summary rows while the store
is behind), so every count is a ``SUM(requests)``.

Latency percentiles (p50, p90, p99 of ``duration`` and ``ttfb``, nearest rank) are
computed in Python on the latest :data:`LATENCY_SAMPLE` requests of the selection
that reached a replica (a refusal's replica is ``""``; summary rows hold only means).

Scope: an administrator sees every row; a project principal the requests made with
its project's keys and those to its project's services; a personal principal its
person's personal requests (:attr:`UsageQuery.scope_project`, ``scope_person``).

Every filter must name something the reader can see (:func:`_known`), else the report
is 404 with the filter's code (``service_not_found``, ``model_not_found``, ...): a
mistyped alias is not "no usage", and another project's reads as missing.
"""

from __future__ import annotations

import calendar
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import attrs

from ..base.errors import ConfigError, NotFound
from ..config import parse_duration
from ..store import Transaction

#: What ``group_by`` may name, and the column each is.
GROUPS: dict[str, str] = {
    "service": "service_id",
    "key": "credential_id",
    "person": "user_id",
    "project": "project_id",
    "model": "model",
}
#: How a group's ID is named: the statement that finds the names of some IDs.
_NAMES: dict[str, str] = {
    "service": "SELECT id, alias AS name FROM inference_services WHERE id IN ({})",
    "key": "SELECT id, name FROM credentials WHERE id IN ({})",
    "person": "SELECT id, username AS name FROM users WHERE id IN ({})",
    "project": "SELECT id, name FROM projects WHERE id IN ({})",
    "model": "SELECT id, name FROM models WHERE id IN ({})",
}
#: Requests whose latency the percentiles are computed on (the latest of the selection).
LATENCY_SAMPLE = 10_000
PERCENTILES = (50, 90, 99)
_FINE = "('ok', 'cancelled')"
_CHUNK = 500


def period_start(period: str, now: float) -> float | None:
    """The start of ``period`` ending ``now``: ``day`` and ``month`` are the current UTC
    calendar day and month; anything else is a duration ending now, or None if not one."""
    moment = time.gmtime(now)
    if period == "day":
        return float(calendar.timegm((moment.tm_year, moment.tm_mon, moment.tm_mday, 0, 0, 0)))
    if period == "month":
        return float(calendar.timegm((moment.tm_year, moment.tm_mon, 1, 0, 0, 0)))
    try:
        return now - parse_duration(period)
    except ConfigError:
        return None


@attrs.frozen(kw_only=True)
class UsageQuery:
    """Which usage to read (every filter optional) and how to group it.

    ``person``, ``project`` and ``model`` match an ID or a name; ``service`` an ID or
    an alias; ``key`` a credential ID.
    """

    since: float | None = None
    until: float | None = None
    service: str | None = None
    key: str | None = None
    person: str | None = None
    project: str | None = None
    model: str | None = None
    group_by: tuple[str, ...] = ()
    #: A project principal's project: only its keys' requests and its services'.
    scope_project: str | None = None
    #: A personal principal's person: only that person's personal requests.
    scope_person: str | None = None


@attrs.frozen(kw_only=True)
class UsageGroup:
    """What the requests of one group (or all of them) used."""

    #: The group's value per ``group_by`` name: ``{"id", "name"}`` (empty without grouping).
    key: dict[str, dict[str, str | None]]
    requests: int
    errors: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    #: Spend in milli-units (:mod:`ficc_core.config.prices`).
    cost: int
    #: ``{"duration": {"p50", "p90", "p99"}, "ttfb": {...}}`` in seconds (None: no sample).
    latency: dict[str, dict[str, float | None]]


@attrs.frozen(kw_only=True)
class UsageReport:
    """The totals of a selection, and its groups."""

    query: UsageQuery
    totals: UsageGroup
    groups: tuple[UsageGroup, ...]


def _where(query: UsageQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = ["1 = 1"]
    params: list[Any] = []

    def add(clause: str, *values: Any) -> None:
        clauses.append(clause)
        params.extend(values)

    if query.since is not None:
        add("finished_at >= ?", query.since)
    if query.until is not None:
        add("finished_at < ?", query.until)
    if query.service is not None:
        add(
            "(service_id = ? OR service_id IN (SELECT id FROM inference_services WHERE alias = ?))",
            query.service,
            query.service,
        )
    if query.key is not None:
        add("credential_id = ?", query.key)
    if query.person is not None:
        add(
            "(user_id = ? OR user_id IN (SELECT id FROM users WHERE username = ?))",
            query.person,
            query.person,
        )
    if query.project is not None:
        add(
            "(project_id = ? OR project_id IN (SELECT id FROM projects WHERE name = ?))",
            query.project,
            query.project,
        )
    if query.model is not None:
        add(
            "(model = ? OR model IN (SELECT id FROM models WHERE name = ?))",
            query.model,
            query.model,
        )
    if query.scope_project is not None:
        add(
            "(project_id = ? OR service_id IN"
            " (SELECT id FROM inference_services WHERE project_id = ?))",
            query.scope_project,
            query.scope_project,
        )
    if query.scope_person is not None:
        add("(user_id = ? AND project_id = '')", query.scope_person)
    return " AND ".join(clauses), params


def _percentiles(values: list[float]) -> dict[str, float | None]:
    values.sort()
    return {
        f"p{p}": values[max(0, math.ceil(p / 100 * len(values)) - 1)] if values else None
        for p in PERCENTILES
    }


def _names(tx: Transaction, group: str, ids: set[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    listed = sorted(i for i in ids if i)
    for start in range(0, len(listed), _CHUNK):
        chunk = listed[start : start + _CHUNK]
        sql = _NAMES[group].format(", ".join("?" for _ in chunk))
        found.update({row["id"]: row["name"] for row in tx.fetch_all(sql, chunk)})
    return found


def _aggregate(
    tx: Transaction, where: str, params: list[Any], groups: Sequence[str]
) -> list[UsageGroup]:
    columns = [GROUPS[name] for name in groups]
    select = "".join(f"{column}, " for column in columns)
    # NULLS FIRST: SQLite's order of a NULL group (requests of no person), PostgreSQL's last.
    ordering = ", ".join(f"{column} NULLS FIRST" for column in columns)
    grouping = f" GROUP BY {', '.join(columns)} ORDER BY {ordering}" if columns else ""
    rows = tx.fetch_all(
        f"SELECT {select}COALESCE(SUM(requests), 0) AS requests,"
        " COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens,"
        " COALESCE(SUM(completion_tokens), 0) AS completion_tokens,"
        " COALESCE(SUM(cost), 0) AS cost"
        f" FROM inference_usage WHERE {where}{grouping}",
        params,
    )
    errors: dict[tuple[Any, ...], dict[str, int]] = defaultdict(dict)
    for row in tx.fetch_all(
        f"SELECT {select}outcome, SUM(requests) AS n FROM inference_usage"
        f" WHERE {where} AND outcome NOT IN {_FINE}"
        f" GROUP BY {''.join(f'{c}, ' for c in columns)}outcome",
        params,
    ):
        errors[tuple(row[c] for c in columns)][row["outcome"]] = row["n"]
    durations: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    ttfbs: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for row in tx.fetch_all(
        f"SELECT {select}duration, ttfb FROM inference_usage"
        f" WHERE {where} AND requests = 1 AND replica <> ''"
        " ORDER BY finished_at DESC LIMIT ?",
        [*params, LATENCY_SAMPLE],
    ):
        value = tuple(row[c] for c in columns)
        durations[value].append(row["duration"])
        if row["ttfb"] is not None:
            ttfbs[value].append(row["ttfb"])
    names = {
        name: _names(tx, name, {row[column] for row in rows if row[column] is not None})
        for name, column in zip(groups, columns, strict=True)
    }
    found = []
    for row in rows:
        value = tuple(row[c] for c in columns)
        found.append(
            UsageGroup(
                key={
                    name: {"id": row[column], "name": names[name].get(row[column] or "")}
                    for name, column in zip(groups, columns, strict=True)
                },
                requests=row["requests"],
                errors=dict(sorted(errors.get(value, {}).items())),
                prompt_tokens=row["prompt_tokens"],
                completion_tokens=row["completion_tokens"],
                cost=row["cost"],
                latency={
                    "duration": _percentiles(durations.get(value, [])),
                    "ttfb": _percentiles(ttfbs.get(value, [])),
                },
            )
        )
    return found


@attrs.frozen
class _Filter:
    """How a filter's value is known to a reader: an entity of ``table`` by ID (or by
    ``name``), seen by a project reader when ``in_project`` holds of it and by a person
    when ``for_person`` does; ``code`` refuses a value that names none, saying what the
    filter ``takes``."""

    what: str
    table: str
    name: str | None
    in_project: str
    for_person: str
    code: str
    takes: str


_SHARED = "SELECT service_id FROM service_shares WHERE user_id = ? OR user_id IS NULL"
#: Each filter, by its query parameter.
_KNOWN: dict[str, _Filter] = {
    "service": _Filter(
        "inference service", "inference_services", "alias",
        "project_id = ?", f"id IN ({_SHARED})", "service_not_found",
        "the ID or alias of a service you can see (ficc inference list)",
    ),
    "key": _Filter(
        "credential", "credentials", None, "project_id = ?", "user_id = ?",
        "credential_not_found", "the ID of a credential you can see (ficc admin list-tokens)",
    ),
    "person": _Filter(
        "person", "users", "username",
        "id IN (SELECT user_id FROM memberships WHERE project_id = ?)", "id = ?",
        "user_not_found", "the ID or username of a person you can see",
    ),
    "project": _Filter(
        "project", "projects", "name",
        "id = ?", "id IN (SELECT project_id FROM memberships WHERE user_id = ?)",
        "project_not_found", "the ID or name of a project you can see",
    ),
    "model": _Filter(
        "model", "models", "name",
        "project_id = ?",
        f"id IN (SELECT model_id FROM inference_services WHERE id IN ({_SHARED}))",
        "model_not_found", "the ID or name of a model you can see (ficc models list)",
    ),
}  # fmt: skip


def _filter(name: str, value: str) -> dict[str, Any]:
    """A :class:`UsageQuery`'s filter given by name (Any: which field is the caller's)."""
    return {name: value}


def _known(tx: Transaction, query: UsageQuery, name: str, value: str) -> bool:
    """Whether filter ``name``'s ``value`` names something the query's reader can see:
    one that usage in the reader's scope names, as the filter matches it (a removed
    service's, a service of another project that the reader's keys invoked, a person
    outside the project who used its services), or by ID (or name) one in the scope's
    project (any for an administrator; for a personal reader, one of theirs or shared
    with them)."""
    found = _KNOWN[name]
    scoped = UsageQuery(
        scope_project=query.scope_project,
        scope_person=query.scope_person,
        **_filter(name, value),
    )
    where, params = _where(scoped)
    if tx.fetch_one(f"SELECT 1 AS found FROM inference_usage WHERE {where} LIMIT 1", params):
        return True
    sql = f"SELECT 1 AS found FROM {found.table} WHERE (id = ?"
    args: list[Any] = [value]
    if found.name is not None:
        sql += f" OR {found.name} = ?"
        args.append(value)
    sql += ")"
    if query.scope_project is not None:
        sql += f" AND {found.in_project}"
        args.append(query.scope_project)
    if query.scope_person is not None:
        sql += f" AND {found.for_person}"
        args.append(query.scope_person)
    return tx.fetch_one(sql + " LIMIT 1", args) is not None


def usage_report(tx: Transaction, query: UsageQuery) -> UsageReport:
    """The totals and groups of the usage ``query`` selects (see the module docs).

    :raises NotFound: when a filter names nothing the reader can see (its code:
        ``service_not_found``, ``credential_not_found``, ``user_not_found``,
        ``project_not_found``, ``model_not_found``).
    """
    for name, found in _KNOWN.items():
        value = getattr(query, name)
        if value is not None and not _known(tx, query, name, value):
            raise NotFound(
                f"no {found.what} {value!r} to report usage of: the {name} filter takes"
                f" {found.takes}",
                code=found.code,
                details={"id": value, "filter": name},
            )
    where, params = _where(query)
    [totals] = _aggregate(tx, where, params, ())
    groups = _aggregate(tx, where, params, query.group_by) if query.group_by else []
    return UsageReport(query=query, totals=totals, groups=tuple(groups))
