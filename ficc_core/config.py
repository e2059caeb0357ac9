"""Configuration: embedded defaults, a TOML file, ``FICC_*`` variables, then flags.

Each later source overrides the earlier ones. Every setting is a field of
:class:`Config` whose ``help`` metadata is the one description of it: the CLI's
``--help``, ``ficc config`` and ``docs/configuration.md`` are all rendered from it.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from .base.errors import ConfigError
from .prices import FREE, Price, parse_price, parse_pricing, render_pricing
from .routing.bands import DEFAULT_BAND, DEFAULT_BANDS, Band, parse_bands, render_bands

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_LISTEN = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):(\d{1,5})")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_HEADER = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")


def parse_duration(text: str | float | int) -> float:
    """Return seconds for ``"90"``, ``"250ms"``, ``"15m"``, ``"12h"``, ``"30d"`` or a number."""
    if isinstance(text, bool):
        raise ConfigError(f"expected a duration, got {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = _DURATION.match(text)
        if not match:
            raise ConfigError(
                f"{text!r} is not a duration; write seconds or e.g. 250ms, 15m, 12h, 30d"
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ConfigError(f"a duration cannot be negative: {text!r}")
    return seconds


def _listen_address(_config: Any, setting: attrs.Attribute, address: str) -> None:
    """Refuse an address that is not ``host:port`` (an IPv6 host in brackets)."""
    match = _LISTEN.fullmatch(address)
    if match is None or int(match.group(2)) > 65535:
        raise ValueError(
            f"{setting.name}: {address!r} is not host:port (an IPv6 host in brackets: [::1]:9484)"
        )


def _database_url(url: str) -> None:
    """Refuse a database URL that is neither empty (SQLite) nor a PostgreSQL one."""
    if url and not url.startswith(("postgresql://", "postgres://")):
        raise ValueError(
            "database_url: expected empty (the SQLite file in data_dir) or a "
            "postgresql://... URL, got a URL of another kind"
        )


def _known_band(config: Any, name: str) -> None:
    if name not in {band.name for band in config.bands}:
        raise ValueError(
            f"band_default: {name!r} is not one of the bands ({render_bands(config.bands)})"
        )


def _header_name(name: str) -> None:
    if not _HEADER.fullmatch(name):
        raise ValueError(f"band_header: {name!r} is not an HTTP header name")


def _share(config: Any, share: float) -> None:
    if not 0 <= share < 1 or share * (len(config.bands) - 1) > 1:
        raise ValueError(
            f"band_min_share: {share!r} must be at least 0, below 1, and leave the bands "
            "below the top their shares together (share x (bands - 1) <= 1)"
        )


def _below_lease(config: Any, _setting: attrs.Attribute, interval: float) -> None:
    if interval >= config.leader_lease:
        raise ValueError(
            f"leader_renew_interval ({interval:g} s) must be shorter than leader_lease "
            f"({config.leader_lease:g} s): a leader must renew before its lease runs out"
        )


def default_data_dir() -> Path:
    """Return the default data directory: ``$XDG_DATA_HOME/ficc`` or ``~/.local/share/ficc``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ficc"


def default_runtime_dir() -> Path:
    """Return the default runtime directory, ``/tmp/ficc-<uid>`` (engine sockets)."""
    return Path(f"/tmp/ficc-{os.getuid()}")


def _setting(default: Any, help: str, *, kind: str, **kwargs: Any) -> Any:
    return attrs.field(default=default, metadata={"help": help, "kind": kind}, **kwargs)


@attrs.frozen
class Config:
    """Every setting of a FICC controller, with its embedded default."""

    data_dir: Path = _setting(
        attrs.Factory(default_data_dir),
        "Directory for the SQLite database and the blob store.",
        kind="path",
        converter=Path,
    )
    host: str = _setting("127.0.0.1", "Address the HTTP service binds to.", kind="str")
    port: int = _setting(8484, "TCP port of the HTTP service; 0 lets the OS choose.", kind="int")
    metrics_listen: str | None = _setting(
        None,
        "host:port of a separate listener serving only GET /metrics (Prometheus text, no "
        "credential; port 0 lets the OS choose), for a scraper that must not reach the API. "
        "When set, the main listener no longer serves /metrics. Unset, the main listener "
        "serves it to anyone who reaches it: every project's service and attempt IDs, with "
        "request, error and token counts.",
        kind="str",
        converter=lambda value: value or None,
        validator=attrs.validators.optional(_listen_address),
    )
    max_body_bytes: int = _setting(
        1 << 20, "Largest JSON request body accepted, in bytes.", kind="int"
    )
    session_lifetime: float = _setting(
        12 * 3600.0, "How long a browser session lasts after login (duration).", kind="duration"
    )
    # -- credentials and logins (docs/api.md#authenticating) ---------------------------
    token_max_lifetime: float = _setting(
        90 * 86400.0,
        "The longest a bearer credential lives, however it is minted (API, CLI, first run); "
        "a longer or absent lifetime is capped to it, as to the issuer's own expiry (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    first_run_secrets: str = _setting(
        "file",
        "Where the first run puts the admin password and token: 'file' writes "
        "data_dir/first-run-secrets (mode 0600) and logs only its path; 'stdout' prints them.",
        kind="str",
        validator=attrs.validators.in_(("file", "stdout")),
    )
    login_max_failures: int = _setting(
        5,
        "Wrong passwords for one user from one client address before that pair is locked "
        "(four times as many per address and per user from untrusted addresses).",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    login_lockout: float = _setting(
        60.0,
        "How long a login lock lasts; each further failure doubles it, up to 64 times (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    secure_cookies: bool = _setting(
        False,
        "Mark session cookies Secure (only sent over HTTPS). Always on when TLS is configured.",
        kind="bool",
    )
    tls_certfile: Path | None = _setting(
        None,
        "PEM certificate chain; with tls_keyfile, the service speaks HTTPS.",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    tls_keyfile: Path | None = _setting(
        None,
        "PEM private key for tls_certfile.",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    shutdown_grace: float = _setting(
        10.0,
        "On SIGINT/SIGTERM, how long in-flight requests may finish before they are cut "
        "(duration); a stream still open then gets a last server_shutting_down SSE event.",
        kind="duration",
    )
    log_level: str = _setting(
        "info",
        "Logging level: debug, info, warning or error.",
        kind="str",
        validator=attrs.validators.in_(("debug", "info", "warning", "error")),
    )
    access_log: bool = _setting(
        True,
        "Log one line per HTTP request at INFO on the logger ficc.access: method, path, "
        "status, duration, credential name, and for invoke requests the service alias, "
        "replica, node and tokens (never a prompt).",
        kind="bool",
    )
    log_format: str = _setting(
        "text",
        "Log lines as text, or 'json': one JSON object per line (time, level, logger, "
        "message, and the access log's fields), for a log collector to parse.",
        kind="str",
        validator=attrs.validators.in_(("text", "json")),
    )
    store_read_threads: int = _setting(
        4,
        "SQLite reader connections, each used from a worker thread off the event loop.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    # -- the store (docs/operations.md#store) --------------------------------------------
    database_url: str = _setting(
        "",
        "Where the store lives. Empty: the SQLite file in data_dir (one controller, one "
        "machine). A libpq URL, postgresql://USER:PASSWORD@HOST:PORT/DBNAME?sslmode=..., "
        "is that PostgreSQL database: the store of an installation with several controllers, "
        "which all name the same one.",
        kind="str",
        validator=lambda _i, _a, value: _database_url(value),
    )
    store_pool_size: int = _setting(
        10,
        "PostgreSQL connections this controller keeps at most, each used by one transaction "
        "at a time from a worker thread. Writes queue for one database-wide lock anyway, so "
        "more connections only help reads; every controller holds its own, and the server's "
        "max_connections (100 by default) bounds their sum.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    store_pool_timeout: float = _setting(
        5.0,
        "How long a request waits for a PostgreSQL connection (every one busy, or the server "
        "unreachable: also the connect timeout) before it is answered 503 store_unavailable "
        "with Retry-After, rather than holding its client (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    store_read_timeout: float = _setting(
        5.0,
        "PostgreSQL: the longest one read statement may run (the server's "
        "statement_timeout for reads); a read past it, or one whose database stopped "
        "answering, is answered 503 store_unavailable (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    store_write_timeout: float = _setting(
        15.0,
        "PostgreSQL: the longest one write statement may run, its wait for the write lock "
        "included (the server's statement_timeout for writes); past it the write is rolled "
        "back and answered 503 store_unavailable (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    store_lock_timeout: float = _setting(
        5.0,
        "PostgreSQL: how long a write waits for the database-wide write lock (lock_timeout) "
        "before it is answered 503 store_unavailable with Retry-After; also how long a "
        "controller may sit idle inside a transaction before the server ends its session "
        "and releases its locks (idle_in_transaction_session_timeout: a frozen or lost "
        "controller holds nothing longer). Keep it below leader_lease (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )

    hub_url: str = _setting(
        "https://huggingface.co",
        "Base URL of the model hub for hub previews (a mirror works; Hugging Face API shapes).",
        kind="str",
    )
    ca_bundle: Path | None = _setting(
        None,
        "PEM bundle of CAs trusted for acquisitions and hub previews (default: certifi's).",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    allow_private_addresses: bool = _setting(
        False,
        "Allow acquisitions, redirects and hub previews to reach loopback and private addresses.",
        kind="bool",
    )
    acquisition_concurrency: int = _setting(
        2,
        "How many file acquisitions download at once.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    acquisition_retries: int = _setting(
        5,
        "Retries of a file after a dropped connection or timeout, with backoff from 0.5 s to 8 s.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    connect_timeout: float = _setting(
        15.0, "Connect timeout for acquisitions and hub requests (duration).", kind="duration"
    )
    read_timeout: float = _setting(
        60.0,
        "Longest wait for the next bytes of a download or hub response (duration).",
        kind="duration",
    )
    storage_reserve: int = _setting(
        32 << 20,
        "Bytes held free on the blob store's disk (a file data_dir/blobs/reserve): when an "
        "upload or acquisition fills the disk, they are given back so that the store can "
        "still write and models can be deleted; blob writes are refused "
        "(507 insufficient_storage) until the reserve can be held again. 0: none.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    partial_tidy_after: float = _setting(
        300.0,
        "How long a partial (a model file being uploaded or acquired) must go without a "
        "write before the leader's tidying may touch it, so that an upload through another "
        "controller sharing the blob directory is never disturbed; tidying runs when a "
        "controller starts leading and every half of this (duration, above 30 s).",
        kind="duration",
        validator=attrs.validators.ge(0),
    )
    upload_idle_timeout: float = _setting(
        60.0,
        "Longest a byte upload may go without receiving a byte before it is refused (408) "
        "and its upload slot freed (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    max_redirects: int = _setting(
        5,
        "Redirects followed per request; each target is re-checked (HTTPS, address).",
        kind="int",
        validator=attrs.validators.ge(0),
    )

    embedded_agent: bool = _setting(
        True,
        "Run a local executor agent (process provider) inside 'ficc serve' as node node_name.",
        kind="bool",
    )
    node_name: str = _setting(
        "local",
        "Node ID of the embedded agent, as placements and /contributors name it.",
        kind="str",
    )
    agent_config: Path | None = _setting(
        None,
        "TOML file declaring an agent's labels and installed runtimes (see docs/agents.md).",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    agent_dir: Path | None = _setting(
        None,
        "Agent state directory (attempt records, engine logs and working directories; "
        "any length). Default: data_dir/agent.",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    runtime_dir: Path | None = _setting(
        None,
        "Directory for the engines' Unix sockets, private to this user (created 0700). "
        "A socket path must fit in 107 bytes, so it may be at most 56 bytes long. "
        "Default: /tmp/ficc-<uid>, short whatever HOME and data_dir are.",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    heartbeat_interval: float = _setting(
        2.0,
        "How often an agent reports its snapshot and attempts to the controller (duration).",
        kind="duration",
    )
    unreachable_after: float = _setting(
        15.0,
        "A node unheard this long is unreachable: it gets no new work (duration).",
        kind="duration",
    )
    lost_after: float = _setting(
        60.0,
        "A node unheard this long is lost: its attempts become unknown (duration).",
        kind="duration",
    )
    lease_duration: float = _setting(
        30.0,
        "How long an attempt may run without a lease renewal before its agent stops it (duration).",
        kind="duration",
    )
    drain_timeout: float = _setting(
        30.0,
        "How long a draining inference service lets in-flight requests finish before it "
        "stops (duration).",
        kind="duration",
    )
    replica_retry_max: float = _setting(
        30.0,
        "The longest wait between attempts to start a failed inference replica; waits double "
        "from one second up to this (duration).",
        kind="duration",
    )
    replica_give_up_after: int = _setting(
        3,
        "After this many attempts in a row of an inference replica fail the same way (same "
        "reason, such as memory_limit), the replica stops retrying and the service shows that "
        "reason until it is started again; 0 retries forever.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    replica_ready_timeout: float = _setting(
        600.0,
        "How long a move waits for its target replica, a restart for each replacement and "
        "a rollout for its new generation to become ready before it gives up and leaves "
        "the serving replicas as they were (duration).",
        kind="duration",
    )
    # -- several controllers (docs/operations.md#several-controllers) ----------------------
    controller_id: str = _setting(
        "",
        "This controller's name among the controllers sharing the store (the leader row, "
        "GET /api/v1/system/controllers, the logs). Empty: the hostname and the listening "
        "port (with port 0, a random suffix, so two on one machine never share one).",
        kind="str",
    )
    advertise_url: str = _setting(
        "",
        "The URL other controllers, clients and a standby's not_leader refusals name for "
        "this controller. Empty: http(s)://host:port of the listener (the port it bound).",
        kind="str",
    )
    leader_lease: float = _setting(
        15.0,
        "How long the leader's claim stands without a renewal; a standby takes the lease "
        "once it ran out. Long enough to survive a slow query or a brief network stall, "
        "short enough that a standby takes over before anyone has finished reading the "
        "alert. The controllers' clocks must agree to well within it (NTP) (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    leader_renew_interval: float = _setting(
        5.0,
        "How often the leader renews its lease and a standby tries to take it: a third of "
        "leader_lease, so two renewals may fail before the leader steps down; a standby "
        "takes over within leader_lease + this (duration).",
        kind="duration",
        validator=[attrs.validators.gt(0), _below_lease],
    )
    follow_interval: float = _setting(
        1.0,
        "How stale a standby's routing table and the leader's view of services created "
        "or changed through another controller may be: both read the store this often "
        "(duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    events_retention: float = _setting(
        7 * 86400.0,
        "How long events (every state change of a service, replica, attempt and node) are "
        "kept; a week covers a weekend's incident read on Monday, and older ones are pruned "
        "every minute, off the request path (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    events_max_per_service: int = _setting(
        1000,
        "The most events kept per service (and per node, of its own): a replica that keeps "
        "failing writes a few events per try, so a crash loop cannot fill the database; "
        "a thousand keep days of an ordinary service's history. The oldest go first.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    log_keepalive: float = _setting(
        25.0,
        "How often a live log stream (logs/stream) sends a ': keepalive' comment while the "
        "log is quiet, so reverse proxies and load balancers do not drop it as idle (their "
        "idle timeouts are often 30 or 60 s) (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    # -- gateway resilience: retries, breakers, timeouts, prompt length (docs/gateway.md) ---
    retries: int = _setting(
        2,
        "How many additional replicas one request may try after a failure (the open refused, "
        "the node or engine unavailable, a 502/503/504, a timeout), and only while nothing "
        "has reached the client; a request is never replayed after that. Two ride out one "
        "dead and one restarting replica without multiplying a request across a whole pool.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    breaker_threshold: int = _setting(
        3,
        "Consecutive failures of one replica before its breaker opens and it leaves the pool "
        "for breaker_cooldown. One failure is often the request's own bad luck (a reset "
        "connection); three in a row with no answer between says the replica. 1 makes the "
        "breaker a pure cooldown after every failure; 0 turns breakers off.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    breaker_cooldown: float = _setting(
        10.0,
        "How long an open breaker keeps its replica out of the pool; then one request may "
        "try it and its outcome closes or reopens the breaker. Long enough for a restarting "
        "engine's readiness probe and the live view to catch up, short enough that a "
        "replica that recovered gets traffic back within seconds (duration).",
        kind="duration",
    )
    timeout_dial: float = _setting(
        10.0,
        "How long opening an engine stream may take: the node's endpoint action accepting "
        "the request (a round trip to a remote node) and reaching the engine. It does no "
        "work for the model, so a slow open means a stuck node or link, and another "
        "replica is tried; 0 for no bound (duration).",
        kind="duration",
    )
    timeout_response_header: float = _setting(
        60.0,
        "How long a streaming request waits for the engine's response head. Engines send "
        "the head of a stream before generating, so this is a liveness check, not a limit "
        "on the answer: past it another replica is tried. It does not apply to a "
        "non-streaming request, whose head comes only with the finished answer "
        "(timeout_generation bounds that); 0 for no bound (duration).",
        kind="duration",
    )
    timeout_generation: float = _setting(
        600.0,
        "How long a non-streaming request may take to get its whole answer. The engine "
        "sends nothing until the completion is done, so this bounds the generation itself: "
        "one bound for both kinds turned a 60 s liveness guard into a limit of about a "
        "hundred tokens on a slow model. Ten minutes is a long answer on slow hardware "
        "(thousands of tokens at a few a second) and still a bound, so a request that "
        "reached an engine which then hung ends even where no liveness probe caught it; "
        "a service's request_deadline and timeout_total may be shorter. 0 for no bound "
        "(duration).",
        kind="duration",
    )
    timeout_first_token: float = _setting(
        600.0,
        "How long a stream may wait after its head for its first chunk (the prompt's "
        "prefill). The response is handed to the client with that chunk, so past this "
        "bound another replica is still tried. Prefill grows with the prompt, so the "
        "default is as generous as timeout_generation (a long prompt on slow hardware "
        "still fits) yet finite; set it lower for an interactive service, 0 for no bound "
        "(duration).",
        kind="duration",
    )
    timeout_idle: float = _setting(
        60.0,
        "The longest gap between two chunks of a stream once it has started: a generating "
        "engine sends a token every fraction of a second, so a minute of silence means it "
        "is stuck. The stream then ends with an engine_timeout error event; 0 for no bound "
        "(duration).",
        kind="duration",
    )
    timeout_total: float = _setting(
        0.0,
        "The longest one request may take from admission to its last byte, for every "
        "service; with a service's request_deadline the smaller wins. 0 (the default): the "
        "service's own deadline says what its clients can wait (duration).",
        kind="duration",
    )
    liveness_interval: float = _setting(
        10.0,
        "How often the controller probes each ready replica's engine (a GET of its health "
        "route through the node's endpoint action, beside its requests). Ten seconds keeps "
        "the probe negligible next to a GPU engine's work and, with liveness_misses, "
        "notices a hung engine within about half a minute; a failed /metrics read or a "
        "request timeout on the replica brings the next probe forward (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    liveness_timeout: float = _setting(
        5.0,
        "The longest one liveness probe may take. An engine answers its health route in "
        "milliseconds even while it generates; five seconds leaves room for a busy host's "
        "scheduling and a remote node's round trip (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    liveness_misses: int = _setting(
        3,
        "Liveness probes a ready replica must miss in a row to be unresponsive: it leaves "
        "routing at once (its requests in flight end with replica_unresponsive), and is "
        "restarted after the same back-off as a crash unless it answers first; 0 turns "
        "the probes off. One miss is a hiccup, three say the engine.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    tokenize_timeout: float = _setting(
        2.0,
        "How long the gateway waits for an engine's tokenizer route when the cheap bounds "
        "cannot tell whether a prompt fits the service's context_length. A tokenizer answers "
        "in milliseconds; past this the request goes on and the engine judges it, since a "
        "refusal is only made when certain (duration).",
        kind="duration",
    )

    # -- priority bands (docs/priority.md) -----------------------------------------------
    bands: tuple[Band, ...] = _setting(
        DEFAULT_BANDS,
        "The priority bands, each name:priority:saturation_ceiling (in TOML an array of "
        "tables with those keys). When a slot frees, the waiting request of the highest "
        "priority gets it; a band's ceiling is the share of a service's slots (replicas x "
        "concurrency) that may be busy for one of its requests to start, so a band below 1 "
        "leaves headroom for the bands above it. The default band may fill a service, so a "
        "deployment that never names a band loses no capacity; batch stops at three "
        "quarters, keeping a quarter for the others' arrivals.",
        kind="bands",
        converter=parse_bands,
    )
    band_default: str = _setting(
        DEFAULT_BAND,
        "The band of a request whose credential and project name none (one of bands).",
        kind="str",
        validator=lambda config, _, name: _known_band(config, name),
    )
    band_header: str = _setting(
        "x-ficc-band",
        "The request header in which a client may name a band to be served in: only one of "
        "lower priority than its credential's (or project's) band is taken, a higher one "
        "is served at the credential's band, since a header is the client's word and "
        "must not promote it; a name that is no band is refused (400 unknown_band).",
        kind="str",
        converter=lambda value: value.strip().lower(),
        validator=lambda _config, _, name: _header_name(name),
    )
    band_queue_capacity: int = _setting(
        64,
        "The most requests of one band waiting for a slot of one service (also never more "
        "than 4 x the service's slots); one more is refused at once (429 service_saturated, "
        "naming the band), since a request that would wait behind that many is better told "
        "to come back than held. Per band, so one band's burst never takes another's places.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    band_queue_ttl: float = _setting(
        30.0,
        "The longest a request waits in its band's queue before it is answered 503 "
        "no_ready_replica (or sooner, at the service's request deadline): under the usual "
        "60 s client and proxy timeouts, so the client hears the refusal and can retry, "
        "rather than the gateway serving a request nobody waits for (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    band_min_share: float = _setting(
        0.1,
        "The share of a service's freed slots each waiting band gets at least, whatever "
        "waits above it and beyond its ceiling: a band that got fewer is owed the next one. "
        "Priority alone would starve batch under constant interactive load; a tenth keeps "
        "it moving while costing the higher bands at most one slot in ten. 0 makes "
        "priority and ceilings absolute.",
        kind="float",
        validator=lambda config, _, share: _share(config, share),
    )

    # -- routing: engine load, scores, affinity (docs/routing.md) ---------------------------
    metrics_state_interval: float = _setting(
        5.0,
        "How often the state gauges of /metrics (services, replicas, nodes, reservations, "
        "transfers) are read from the store (duration); a scrape never waits on the store.",
        kind="duration",
    )
    scrape_interval: float = _setting(
        1.0,
        "How often the gateway reads each ready replica engine's /metrics (running, waiting, "
        "KV use), off the request path; between reads it adds the requests it sent itself, "
        "so a second is fine-grained enough at one small read per replica (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scrape_timeout: float = _setting(
        1.0,
        "The longest one /metrics read may take; an engine answers in milliseconds unless it "
        "is in trouble, and a late answer is already old (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scrape_stale_after: float = _setting(
        5.0,
        "A replica whose last good /metrics read is older than this is stale: its figures "
        "are not trusted and it is avoided like one over its KV ceiling while a fresh one "
        "has room. Several missed reads, so one slow answer does not flap it (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scoring_target_inflight: float = _setting(
        8.0,
        "Requests in flight on one engine that count as one unit of score: a replica's "
        "estimated in-flight requests are divided by it (the load a healthy replica carries).",
        kind="float",
        validator=attrs.validators.gt(0),
    )
    scoring_target_waiting: float = _setting(
        2.0,
        "Requests queued inside one engine that count as one unit of score: kept lower than "
        "the in-flight target because a waiting request has not started at all.",
        kind="float",
        validator=attrs.validators.gt(0),
    )
    scoring_kv_ceiling: float = _setting(
        0.9,
        "KV cache use (0 to 1) at or over which a replica is avoided while another is under "
        "it: near full, an engine preempts or queues, and every new request there waits.",
        kind="float",
        validator=attrs.validators.and_(attrs.validators.gt(0), attrs.validators.le(1)),
    )
    scoring_session_load_factor: float = _setting(
        0.1,
        "Share of a request in flight each live session bound to a replica adds to its "
        "score: a session idle between turns comes back, so new sessions spread evenly.",
        kind="float",
        validator=attrs.validators.ge(0),
    )
    session_header: str = _setting(
        "x-session-id",
        "Request header naming the client's session: its requests stay on one replica, "
        "whose engine holds the conversation's KV cache (tier 0, most of the win for "
        "multi-turn traffic). Values over 256 characters are not used.",
        kind="str",
        validator=attrs.validators.min_len(1),
    )
    session_ttl: float = _setting(
        600.0,
        "How long a session stays bound to its replica after its last request; an engine "
        "reuses an idle slot's cache within minutes, so longer buys nothing (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    session_max_entries: int = _setting(
        100_000,
        "Sessions remembered at most (least recently used go first), bounding memory "
        "whatever clients send.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    prefix_enabled: bool = _setting(
        True,
        "Route by an approximate index of the prompts' prefixes (tier 1), so requests "
        "without a session header also reach the replica that has their prefix cached; off, "
        "session affinity alone.",
        kind="bool",
    )
    prefix_max_entries: int = _setting(
        100_000,
        "Prefix entries the index holds at most (a 1 KiB block of prompt each, or a 128-byte "
        "piece of a prompt's last block), least recently used going first: up to about 100 "
        "MiB of prompts for a few MiB of memory.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    prefix_min_match: int = _setting(
        1024,
        "The shortest prefix match, in bytes, worth acting on: a shorter one is cheap for "
        "the engine to compute again.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    prefix_ttl: float = _setting(
        300.0,
        "How long an index entry is believed after its last use: an engine evicts on its "
        "own schedule, so an old entry may describe a cache that is gone (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    prefix_match_ratio: float = _setting(
        0.5,
        "Share of the prompt a prefix match must cover to be acted on: below it, most of "
        "the prompt is computed anyway and load should decide.",
        kind="float",
        validator=attrs.validators.and_(attrs.validators.ge(0), attrs.validators.le(1)),
    )
    affinity_balance_abs: float = _setting(
        4.0,
        "Imbalance guard, absolute side: affinity is abandoned only when its replica has "
        "more than this many requests in flight over the least loaded one AND the relative "
        "side trips too, so a busy cached replica is used until the gap is real.",
        kind="float",
        validator=attrs.validators.ge(0),
    )
    affinity_balance_rel: float = _setting(
        1.5,
        "Imbalance guard, relative side: affinity's replica must also carry more than this "
        "many times the least loaded one's requests before affinity is abandoned (both "
        "sides must trip, so small and large engines are both judged fairly).",
        kind="float",
        validator=attrs.validators.ge(1),
    )

    # -- keys, limits, budgets and accounting (docs/limits.md, people.md, usage.md) --------
    auth_cache_ttl: float = _setting(
        5.0,
        "How long a verified credential is served from memory, and how often revocations "
        "written by another process are looked for: a revoked key works at most this long, "
        "traded against one store read per key per period (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    auth_negative_ttl: float = _setting(
        30.0,
        "How long a rejected bearer token is remembered as rejected, so a client looping "
        "with a bad key costs no store read per request (duration; 0 remembers nothing).",
        kind="duration",
        validator=attrs.validators.ge(0),
    )
    default_rpm: int = _setting(
        600,
        "Requests per minute of a key that no scope (its credential, its person, its "
        "project) gives a limit to. Unlimited is found by the bill or the outage, so the "
        "default is a limit a person at a keyboard never meets and a runaway loop does; "
        "0 keeps no limit, as a choice. A fallback, not a ceiling: an explicit limit at any "
        "scope wins, above or below.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    default_tpm: int = _setting(
        1_000_000,
        "Tokens per minute (prompt and completion) of a key that no scope gives a limit to; "
        "0 keeps no limit. As default_rpm: a fallback, not a ceiling.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    limits_sync_interval: float = _setting(
        1.0,
        "How often each controller process adds its counted requests, tokens and spend to "
        "the store and reads the others': the bound on how far processes sharing a store "
        "can drift past a limit together (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    pricing: tuple[tuple[str, Price], ...] = _setting(
        (),
        "What each model costs, for budgets and spend: model (its registry name or ID) to "
        "whole units per 1k prompt and per 1k completion tokens (TOML: a table of "
        "{prompt_per_1k, completion_per_1k} tables; variable: model=prompt:completion,...). "
        "A model absent from it costs default_price.",
        kind="pricing",
        converter=parse_pricing,
    )
    default_price: Price = _setting(
        FREE,
        "The price of a model absent from pricing (prompt_per_1k:completion_per_1k), "
        "nothing unless set.",
        kind="price",
        converter=parse_price,
    )
    signup_open: bool = _setting(
        False,
        "Serve self-service signup. Accounts it creates are pending until an administrator "
        "approves them (ficc admin users approve), so this is not a way in; off, accounts "
        "are made by administrators.",
        kind="bool",
    )
    personal_disabled: bool = _setting(
        False,
        "Refuse personal keys: people then use the gateway only through the projects they "
        "are members of.",
        kind="bool",
    )
    personal_rpm: int = _setting(
        60,
        "Requests per minute of one person's personal keys together (0: default_rpm).",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    personal_tpm: int = _setting(
        100_000,
        "Tokens per minute of one person's personal keys together (0: default_tpm).",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    personal_budget: int = _setting(
        0,
        "Whole units one person's personal keys may spend per personal_period (0: none).",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    personal_period: str = _setting(
        "month",
        "The period personal_budget renews over: day or month (UTC calendar).",
        kind="str",
        validator=attrs.validators.in_(("day", "month")),
    )
    # -- on-demand services (docs/inference.md, "Scaling") --------------------------------
    activation_wait: float = _setting(
        60.0,
        "How long a request to an idle on-demand service waits for it to load before it "
        "is answered 503 activation_timeout with Retry-After. Refusing at once would fail "
        "the first request for every model; waiting without a bound turns a request into "
        "a job, and a client that budgeted thirty seconds holds a connection for ten "
        "minutes (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    activation_queue: int = _setting(
        256,
        "Requests one service may hold waiting for its activation; more are answered 429 "
        "service_saturated at once, so a burst against a cold model cannot pile up "
        "connections without bound.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    activation_keepalive: float = _setting(
        5.0,
        "How often a streaming request waiting for an activation gets an SSE comment, so "
        "proxies and clients with short idle timeouts keep the connection. The first one "
        "goes this long after the request came: a model that loads sooner answers with "
        "its own status (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    activation_retry: float = _setting(
        10.0,
        "How long a failed activation's reason answers new requests at once before the "
        "next request tries again: a broken engine is not relaunched for every request "
        "of a burst (duration).",
        kind="duration",
        validator=attrs.validators.ge(0),
    )
    idle_timeout: float = _setting(
        900.0,
        "How long a replica of a scaled service may serve nothing before it stops (while "
        "more than its min run) when its specification names no idle_timeout. Minutes, "
        "not seconds: stopping a replica throws away the KV cache that affinity filled, "
        "so the saving is worth more than the cache only over a real idle period "
        "(duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scale_out_queue: float = _setting(
        2.0,
        "Requests waiting per running replica above which a scaled service is short of "
        "capacity (one of the two scale-out signals).",
        kind="float",
        validator=attrs.validators.gt(0),
    )
    scale_out_wait: float = _setting(
        2.0,
        "Queue wait, in seconds, of the longest-waiting request above which a scaled "
        "service is short of capacity (the other scale-out signal) (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scale_out_window: float = _setting(
        10.0,
        "How long a scale-out signal must hold before another replica starts: a burst "
        "shorter than this is served by the queue, not by an engine load (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scale_cooldown: float = _setting(
        60.0,
        "The least time between two scaling decisions of one service, so it never flaps "
        "(activation is not held to it, nor does it start one: a request for an idle "
        "service always wakes it, and a service woken into a burst scales out once the "
        "window held) (duration).",
        kind="duration",
        validator=attrs.validators.ge(0),
    )
    usage_flush_interval: float = _setting(
        1.0,
        "How often buffered usage records are written to the store; each is in the "
        "controller's spool (data_dir/usage-spool) at once, so a killed controller's "
        "are written at the next start (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    usage_batch_size: int = _setting(
        500,
        "Usage records written in one transaction; a fuller buffer is written at once.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    usage_buffer_size: int = _setting(
        100_000,
        "Usage records held while the store is slow or down. Beyond it records are "
        "aggregated per key, then dropped (counted and logged) rather than blocking a "
        "request: losing accounting is bad, turning a stalled database into an outage "
        "is worse.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    # -- the web console (docs/ui.md) ------------------------------------------------------
    landing_contact: str = _setting(
        "",
        "Where someone without an account should go, shown on the console's landing page "
        "at /: an address, a URL or a channel name (rendered as a link when it is an "
        "e-mail address or an http(s) URL, as text otherwise). Empty, the page says to ask "
        "the operator.",
        kind="str",
    )
    landing_notice: str = _setting(
        "",
        "An optional line of the operator's own on the landing page, for whatever a visitor "
        "needs to know that the page cannot guess (plain text).",
        kind="str",
    )
    console_refresh: float = _setting(
        5.0,
        "How often the console's dashboard polls the API for nodes, services, models and "
        "events while the page is visible (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )

    @property
    def blobs_path(self) -> Path:
        """The content-addressed blob store inside :attr:`data_dir`."""
        return self.data_dir / "blobs"

    @property
    def database_path(self) -> Path:
        """The SQLite database file inside :attr:`data_dir`."""
        return self.data_dir / "ficc.sqlite3"

    @property
    def agent_path(self) -> Path:
        """The embedded agent's state directory (:attr:`agent_dir`, else inside data_dir)."""
        return self.agent_dir if self.agent_dir is not None else self.data_dir / "agent"

    @property
    def runtime_path(self) -> Path:
        """The engines' socket directory (:attr:`runtime_dir`, else ``/tmp/ficc-<uid>``)."""
        return self.runtime_dir if self.runtime_dir is not None else default_runtime_dir()

    @property
    def tls(self) -> bool:
        """Whether the service speaks HTTPS."""
        return self.tls_certfile is not None and self.tls_keyfile is not None


def env_name(field: attrs.Attribute) -> str:
    """Return the environment variable that sets ``field``."""
    return "FICC_" + field.name.upper()


def _coerce(field: attrs.Attribute, value: Any, source: str) -> Any:
    kind = field.metadata["kind"]
    parser = {"bands": parse_bands, "pricing": parse_pricing, "price": parse_price}.get(kind)
    if parser is not None:
        try:
            return parser(value, f"{source}: {field.name}")
        except ConfigError as exc:
            raise ConfigError(
                exc.message, details={"setting": field.name, "source": source}
            ) from None
    try:
        if kind == "duration":
            return parse_duration(value)
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ValueError
            number = float(value)
            if number != number or number in (float("inf"), float("-inf")):
                raise ValueError
            return number
        if kind == "bool":
            if isinstance(value, bool):
                return value
            lowered = str(value).strip().lower()
            if lowered in {"1", "true", "yes", "on"}:
                return True
            if lowered in {"0", "false", "no", "off", ""}:
                return False
            raise ValueError
        if kind == "path" and isinstance(value, str | os.PathLike):
            return Path(os.path.expanduser(value))
        if kind == "str":
            if not isinstance(value, str):
                raise ValueError
            return value
    except (ValueError, ConfigError):
        pass
    raise ConfigError(
        f"{source}: {field.name} must be a {kind}, got {value!r}",
        details={"setting": field.name, "source": source},
    )


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build a :class:`Config` from defaults, ``path`` (TOML), ``environ``, then ``overrides``.

    ``overrides`` holds values from command-line flags; ``None`` values are ignored.
    Unknown keys in the file are refused, naming the key.
    """
    environ = os.environ if environ is None else environ
    fields = {field.name: field for field in attrs.fields(Config)}
    values: dict[str, Any] = {}
    if path is None and environ.get("FICC_CONFIG"):
        path = Path(environ["FICC_CONFIG"])
    if path is not None:
        try:
            document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"configuration file {path} does not exist") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
        unknown = sorted(set(document) - set(fields))
        if unknown:
            raise ConfigError(
                f"{path}: unknown setting(s) {', '.join(unknown)}; see docs/configuration.md",
                details={"unknown": unknown},
            )
        for name, value in document.items():
            values[name] = _coerce(fields[name], value, str(path))
    for name, field in fields.items():
        variable = env_name(field)
        if variable in environ:
            values[name] = _coerce(field, environ[variable], variable)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = _coerce(fields[name], value, f"--{name.replace('_', '-')}")
    try:
        return Config(**values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None


def render_reference() -> str:
    """Render the configuration reference table (kept in ``docs/configuration.md``)."""
    lines = [
        "| Setting | Environment | Type | Default | Meaning |",
        "|---|---|---|---|---|",
    ]
    for field in attrs.fields(Config):
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            default = "`$XDG_DATA_HOME/ficc` or `~/.local/share/ficc`"
        elif field.default is None:
            default = "unset"
        elif field.default == "":
            default = "empty"
        elif field.metadata["kind"] == "bands":
            default = f"`{render_bands(field.default)}`"
        elif field.metadata["kind"] == "pricing":
            default = f"`{render_pricing(field.default)}`" if field.default else "none"
        else:
            default = f"`{field.default}`"
        lines.append(
            f"| `{field.name}` | `{env_name(field)}` | {field.metadata['kind']} | {default} "
            f"| {field.metadata['help']} |"
        )
    return "\n".join(lines) + "\n"
