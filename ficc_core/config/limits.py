"""Keys, limits, budgets and prices (docs/limits.md, people.md, usage.md)."""

from __future__ import annotations

import attrs

from .fields import setting
from .prices import FREE, Price, parse_price, parse_pricing


@attrs.frozen(slots=False)
class LimitSettings:
    """Keys, limits, budgets and prices (a section of Config)."""

    auth_cache_ttl: float = setting(
        5.0,
        "How long a verified credential is served from memory, and how often revocations "
        "written by another process are looked for: a revoked key works at most this long, "
        "traded against one store read per key per period (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    auth_negative_ttl: float = setting(
        30.0,
        "How long a rejected bearer token is remembered as rejected, so a client looping "
        "with a bad key costs no store read per request (duration; 0 remembers nothing).",
        kind="duration",
        validator=attrs.validators.ge(0),
    )
    default_rpm: int = setting(
        600,
        "Requests per minute of a key that no scope (its credential, its person, its "
        "project) gives a limit to. Unlimited is found by the bill or the outage, so the "
        "default is a limit a person at a keyboard never meets and a runaway loop does; "
        "0 keeps no limit, as a choice. A fallback, not a ceiling: an explicit limit at any "
        "scope wins, above or below.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    default_tpm: int = setting(
        1_000_000,
        "Tokens per minute (prompt and completion) of a key that no scope gives a limit to; "
        "0 keeps no limit. As default_rpm: a fallback, not a ceiling.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    limits_sync_interval: float = setting(
        1.0,
        "How often each controller process adds its counted requests, tokens and spend to "
        "the store and reads the others': the bound on how far processes sharing a store "
        "can drift past a limit together (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    pricing: tuple[tuple[str, Price], ...] = setting(
        (),
        "What each model costs, for budgets and spend: model (its registry name or ID) to "
        "whole units per 1k prompt and per 1k completion tokens (TOML: a table of "
        "{prompt_per_1k, completion_per_1k} tables; variable: model=prompt:completion,...). "
        "A model absent from it costs default_price.",
        kind="pricing",
        converter=parse_pricing,
    )
    default_price: Price = setting(
        FREE,
        "The price of a model absent from pricing (prompt_per_1k:completion_per_1k), "
        "nothing unless set.",
        kind="price",
        converter=parse_price,
    )
    signup_open: bool = setting(
        False,
        "Serve self-service signup. Accounts it creates are pending until an administrator "
        "approves them (ficc admin users approve), so this is not a way in; off, accounts "
        "are made by administrators.",
        kind="bool",
    )
    personal_disabled: bool = setting(
        False,
        "Refuse personal keys: people then use the gateway only through the projects they "
        "are members of.",
        kind="bool",
    )
    personal_rpm: int = setting(
        60,
        "Requests per minute of one person's personal keys together (0: default_rpm).",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    personal_tpm: int = setting(
        100_000,
        "Tokens per minute of one person's personal keys together (0: default_tpm).",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    personal_budget: int = setting(
        0,
        "Whole units one person's personal keys may spend per personal_period (0: none).",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    personal_period: str = setting(
        "month",
        "The period personal_budget renews over: day or month (UTC calendar).",
        kind="str",
        validator=attrs.validators.in_(("day", "month")),
    )
