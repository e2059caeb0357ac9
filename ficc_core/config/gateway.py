"""Gateway resilience (docs/gateway.md): retries, breakers, timeouts, prompt length."""

from __future__ import annotations

import attrs

from .fields import setting


@attrs.frozen(slots=False)
class GatewaySettings:
    """Gateway resilience (a section of Config)."""

    retries: int = setting(
        2,
        "How many additional replicas one request may try after a failure (the open refused, "
        "the node or engine unavailable, a 502/503/504, a timeout), and only while nothing "
        "has reached the client; a request is never replayed after that. Two ride out one "
        "dead and one restarting replica without multiplying a request across a whole pool.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    breaker_threshold: int = setting(
        3,
        "Consecutive failures of one replica before its breaker opens and it leaves the pool "
        "for breaker_cooldown. One failure is often the request's own bad luck (a reset "
        "connection); three in a row with no answer between says the replica. 1 makes the "
        "breaker a pure cooldown after every failure; 0 turns breakers off.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    breaker_cooldown: float = setting(
        10.0,
        "How long an open breaker keeps its replica out of the pool; then one request may "
        "try it and its outcome closes or reopens the breaker. Long enough for a restarting "
        "engine's readiness probe and the live view to catch up, short enough that a "
        "replica that recovered gets traffic back within seconds (duration).",
        kind="duration",
    )
    timeout_dial: float = setting(
        10.0,
        "How long opening an engine stream may take: the node's endpoint action accepting "
        "the request (a round trip to a remote node) and reaching the engine. It does no "
        "work for the model, so a slow open means a stuck node or link, and another "
        "replica is tried; 0 for no bound (duration).",
        kind="duration",
    )
    timeout_response_header: float = setting(
        60.0,
        "How long a streaming request waits for the engine's response head. Engines send "
        "the head of a stream before generating, so this is a liveness check, not a limit "
        "on the answer: past it another replica is tried. It does not apply to a "
        "non-streaming request, whose head comes only with the finished answer "
        "(timeout_generation bounds that); 0 for no bound (duration).",
        kind="duration",
    )
    timeout_generation: float = setting(
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
    timeout_first_token: float = setting(
        600.0,
        "How long a stream may wait after its head for its first chunk (the prompt's "
        "prefill). The response is handed to the client with that chunk, so past this "
        "bound another replica is still tried. Prefill grows with the prompt, so the "
        "default is as generous as timeout_generation (a long prompt on slow hardware "
        "still fits) yet finite; set it lower for an interactive service, 0 for no bound "
        "(duration).",
        kind="duration",
    )
    timeout_idle: float = setting(
        60.0,
        "The longest gap between two chunks of a stream once it has started: a generating "
        "engine sends a token every fraction of a second, so a minute of silence means it "
        "is stuck. The stream then ends with an engine_timeout error event; 0 for no bound "
        "(duration).",
        kind="duration",
    )
    timeout_total: float = setting(
        0.0,
        "The longest one request may take from admission to its last byte, for every "
        "service; with a service's request_deadline the smaller wins. 0 (the default): the "
        "service's own deadline says what its clients can wait (duration).",
        kind="duration",
    )
    liveness_interval: float = setting(
        10.0,
        "How often the controller probes each ready replica's engine (a GET of its health "
        "route through the node's endpoint action, beside its requests). Ten seconds keeps "
        "the probe negligible next to a GPU engine's work and, with liveness_misses, "
        "notices a hung engine within about half a minute; a failed /metrics read or a "
        "request timeout on the replica brings the next probe forward (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    liveness_timeout: float = setting(
        5.0,
        "The longest one liveness probe may take. An engine answers its health route in "
        "milliseconds even while it generates; five seconds leaves room for a busy host's "
        "scheduling and a remote node's round trip (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    liveness_misses: int = setting(
        3,
        "Liveness probes a ready replica must miss in a row to be unresponsive: it leaves "
        "routing at once (its requests in flight end with replica_unresponsive), and is "
        "restarted after the same back-off as a crash unless it answers first; 0 turns "
        "the probes off. One miss is a hiccup, three say the engine.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    tokenize_timeout: float = setting(
        2.0,
        "How long the gateway waits for an engine's tokenizer route when the cheap bounds "
        "cannot tell whether a prompt fits the service's context_length. A tokenizer answers "
        "in milliseconds; past this the request goes on and the engine judges it, since a "
        "refusal is only made when certain (duration).",
        kind="duration",
    )
