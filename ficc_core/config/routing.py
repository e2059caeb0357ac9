"""Routing (docs/routing.md): engine load, scores, affinity."""

from __future__ import annotations

import attrs

from .fields import setting


@attrs.frozen(slots=False)
class RoutingSettings:
    """Routing (a section of Config)."""

    metrics_state_interval: float = setting(
        5.0,
        "How often the state gauges of /metrics (services, replicas, nodes, reservations, "
        "transfers) are read from the store (duration); a scrape never waits on the store.",
        kind="duration",
    )
    scrape_interval: float = setting(
        1.0,
        "How often the gateway reads each ready replica engine's /metrics (running, waiting, "
        "KV use), off the request path; between reads it adds the requests it sent itself, "
        "so a second is fine-grained enough at one small read per replica (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scrape_timeout: float = setting(
        1.0,
        "The longest one /metrics read may take; an engine answers in milliseconds unless it "
        "is in trouble, and a late answer is already old (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scrape_stale_after: float = setting(
        5.0,
        "A replica whose last good /metrics read is older than this is stale: its figures "
        "are not trusted and it is avoided like one over its KV ceiling while a fresh one "
        "has room. Several missed reads, so one slow answer does not flap it (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scoring_target_inflight: float = setting(
        8.0,
        "Requests in flight on one engine that count as one unit of score: a replica's "
        "estimated in-flight requests are divided by it (the load a healthy replica carries).",
        kind="float",
        validator=attrs.validators.gt(0),
    )
    scoring_target_waiting: float = setting(
        2.0,
        "Requests queued inside one engine that count as one unit of score: kept lower than "
        "the in-flight target because a waiting request has not started at all.",
        kind="float",
        validator=attrs.validators.gt(0),
    )
    scoring_kv_ceiling: float = setting(
        0.9,
        "KV cache use (0 to 1) at or over which a replica is avoided while another is under "
        "it: near full, an engine preempts or queues, and every new request there waits.",
        kind="float",
        validator=attrs.validators.and_(attrs.validators.gt(0), attrs.validators.le(1)),
    )
    scoring_session_load_factor: float = setting(
        0.1,
        "Share of a request in flight each live session bound to a replica adds to its "
        "score: a session idle between turns comes back, so new sessions spread evenly.",
        kind="float",
        validator=attrs.validators.ge(0),
    )
    session_header: str = setting(
        "x-session-id",
        "Request header naming the client's session: its requests stay on one replica, "
        "whose engine holds the conversation's KV cache (tier 0, most of the win for "
        "multi-turn traffic). Values over 256 characters are not used.",
        kind="str",
        validator=attrs.validators.min_len(1),
    )
    session_ttl: float = setting(
        600.0,
        "How long a session stays bound to its replica after its last request; an engine "
        "reuses an idle slot's cache within minutes, so longer buys nothing (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    session_max_entries: int = setting(
        100_000,
        "Sessions remembered at most (least recently used go first), bounding memory "
        "whatever clients send.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    prefix_enabled: bool = setting(
        True,
        "Route by an approximate index of the prompts' prefixes (tier 1), so requests "
        "without a session header also reach the replica that has their prefix cached; off, "
        "session affinity alone.",
        kind="bool",
    )
    prefix_max_entries: int = setting(
        100_000,
        "Prefix entries the index holds at most (a 1 KiB block of prompt each, or a 128-byte "
        "piece of a prompt's last block), least recently used going first: up to about 100 "
        "MiB of prompts for a few MiB of memory.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    prefix_min_match: int = setting(
        1024,
        "The shortest prefix match, in bytes, worth acting on: a shorter one is cheap for "
        "the engine to compute again.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    prefix_ttl: float = setting(
        300.0,
        "How long an index entry is believed after its last use: an engine evicts on its "
        "own schedule, so an old entry may describe a cache that is gone (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    prefix_match_ratio: float = setting(
        0.5,
        "Share of the prompt a prefix match must cover to be acted on: below it, most of "
        "the prompt is computed anyway and load should decide.",
        kind="float",
        validator=attrs.validators.and_(attrs.validators.ge(0), attrs.validators.le(1)),
    )
    affinity_balance_abs: float = setting(
        4.0,
        "Imbalance guard, absolute side: affinity is abandoned only when its replica has "
        "more than this many requests in flight over the least loaded one AND the relative "
        "side trips too, so a busy cached replica is used until the gap is real.",
        kind="float",
        validator=attrs.validators.ge(0),
    )
    affinity_balance_rel: float = setting(
        1.5,
        "Imbalance guard, relative side: affinity's replica must also carry more than this "
        "many times the least loaded one's requests before affinity is abandoned (both "
        "sides must trip, so small and large engines are both judged fairly).",
        kind="float",
        validator=attrs.validators.ge(1),
    )
