"""On-demand services (docs/inference.md, "Scaling"): activation, scaling out and in."""

from __future__ import annotations

import attrs

from .fields import setting


@attrs.frozen(slots=False)
class ScalingSettings:
    """Activation and scaling of on-demand services (a section of Config)."""

    activation_wait: float = setting(
        60.0,
        "How long a request to an idle on-demand service waits for it to load before it "
        "is answered 503 activation_timeout with Retry-After. Refusing at once would fail "
        "the first request for every model; waiting without a bound turns a request into "
        "a job, and a client that budgeted thirty seconds holds a connection for ten "
        "minutes (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    activation_queue: int = setting(
        256,
        "Requests one service may hold waiting for its activation; more are answered 429 "
        "service_saturated at once, so a burst against a cold model cannot pile up "
        "connections without bound.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    activation_keepalive: float = setting(
        5.0,
        "How often a streaming request waiting for an activation gets an SSE comment, so "
        "proxies and clients with short idle timeouts keep the connection. The first one "
        "goes this long after the request came: a model that loads sooner answers with "
        "its own status (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    activation_retry: float = setting(
        10.0,
        "How long a failed activation's reason answers new requests at once before the "
        "next request tries again: a broken engine is not relaunched for every request "
        "of a burst (duration).",
        kind="duration",
        validator=attrs.validators.ge(0),
    )
    idle_timeout: float = setting(
        900.0,
        "How long a replica of a scaled service may serve nothing before it stops (while "
        "more than its min run) when its specification names no idle_timeout. Minutes, "
        "not seconds: stopping a replica throws away the KV cache that affinity filled, "
        "so the saving is worth more than the cache only over a real idle period "
        "(duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scale_out_queue: float = setting(
        2.0,
        "Requests waiting per running replica above which a scaled service is short of "
        "capacity (one of the two scale-out signals).",
        kind="float",
        validator=attrs.validators.gt(0),
    )
    scale_out_wait: float = setting(
        2.0,
        "Queue wait, in seconds, of the longest-waiting request above which a scaled "
        "service is short of capacity (the other scale-out signal) (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scale_out_window: float = setting(
        10.0,
        "How long a scale-out signal must hold before another replica starts: a burst "
        "shorter than this is served by the queue, not by an engine load (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    scale_cooldown: float = setting(
        60.0,
        "The least time between two scaling decisions of one service, so it never flaps "
        "(activation is not held to it, nor does it start one: a request for an idle "
        "service always wakes it, and a service woken into a burst scales out once the "
        "window held) (duration).",
        kind="duration",
        validator=attrs.validators.ge(0),
    )
