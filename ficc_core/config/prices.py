"""Prices: what a model's tokens cost, for budgets and spend (docs/limits.md).

A price is whole units per 1,000 prompt tokens and per 1,000 completion tokens. The
``pricing`` setting maps a model (its registry name, or its ID) to a price; a model
absent from it costs ``default_price``, which is nothing unless set. Spend is kept in
*milli-units* (1/1000 of a unit), an integer: ``tokens x price_per_1k`` is exactly
that, so no request's cost is ever rounded and spend adds up to the unit.

In TOML::

    default_price = {prompt_per_1k = 1, completion_per_1k = 2}
    [pricing."smollm2-135m-instruct"]
    prompt_per_1k = 5
    completion_per_1k = 10

In a ``FICC_PRICING`` variable: ``model=prompt:completion,model=prompt:completion``;
``FICC_DEFAULT_PRICE``: ``prompt:completion``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..base.errors import ConfigError

__all__ = [
    "FREE",
    "MILLI",
    "Price",
    "parse_price",
    "parse_pricing",
    "render_pricing",
    "units_text",
]

#: Milli-units in one unit.
MILLI = 1000


def _price_field() -> Any:
    return attrs.field(
        default=0, validator=[attrs.validators.instance_of(int), attrs.validators.ge(0)]
    )


@attrs.frozen
class Price:
    """Whole units per 1,000 prompt tokens and per 1,000 completion tokens."""

    prompt_per_1k: int = _price_field()
    completion_per_1k: int = _price_field()

    def cost(self, prompt: int | None, completion: int | None) -> int:
        """What ``prompt`` and ``completion`` tokens cost, in milli-units."""
        return (prompt or 0) * self.prompt_per_1k + (completion or 0) * self.completion_per_1k

    def __str__(self) -> str:
        return f"{self.prompt_per_1k}:{self.completion_per_1k}"


#: The price of a model nobody priced, unless ``default_price`` says otherwise.
FREE = Price()


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a whole number of units, got {value!r}")
    if isinstance(value, str):
        value = value.strip()
        if not value.isdigit():
            raise ConfigError(f"{where}: expected a whole number of units, got {value!r}")
        value = int(value)
    if not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: expected a whole number of units (>= 0), got {value!r}")
    return value


def parse_price(value: Any, where: str = "default_price") -> Price:
    """A :class:`Price` from a table ``{prompt_per_1k, completion_per_1k}`` or
    ``"prompt:completion"``."""
    if isinstance(value, Price):
        return value
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) != 2:
            raise ConfigError(f"{where}: {value!r} is not prompt_per_1k:completion_per_1k")
        return Price(_whole(parts[0], where), _whole(parts[1], where))
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"prompt_per_1k", "completion_per_1k"})
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}")
        return Price(
            _whole(value.get("prompt_per_1k", 0), f"{where}.prompt_per_1k"),
            _whole(value.get("completion_per_1k", 0), f"{where}.completion_per_1k"),
        )
    raise ConfigError(f"{where}: expected a price table or prompt:completion, got {value!r}")


def parse_pricing(value: Any, where: str = "pricing") -> tuple[tuple[str, Price], ...]:
    """The ``pricing`` setting: (model, price) pairs, sorted by model, from a TOML table
    of price tables or ``model=prompt:completion,...``."""
    if isinstance(value, tuple) and all(isinstance(p, tuple) for p in value):
        return tuple(sorted((str(m), parse_price(p, f"{where}.{m}")) for m, p in value))
    entries: dict[str, Price] = {}
    if isinstance(value, str):
        for item in filter(None, (part.strip() for part in value.split(","))):
            model, sep, price = item.partition("=")
            if not sep or not model.strip():
                raise ConfigError(f"{where}: {item!r} is not model=prompt:completion")
            entries[model.strip()] = parse_price(price, f"{where}.{model.strip()}")
    elif isinstance(value, Mapping):
        for model, price in value.items():
            entries[str(model)] = parse_price(price, f"{where}.{model}")
    else:
        raise ConfigError(f"{where}: expected a table of prices, got {value!r}")
    return tuple(sorted(entries.items()))


def render_pricing(pricing: tuple[tuple[str, Price], ...]) -> str:
    """``pricing`` as its variable form (the configuration reference's default column)."""
    return ",".join(f"{model}={price}" for model, price in pricing)


def units_text(milli: int) -> str:
    """Milli-units as exact decimal units: ``1234`` is ``"1.234"``, ``5`` is ``"0.005"``."""
    sign = "-" if milli < 0 else ""
    whole, rest = divmod(abs(milli), MILLI)
    return f"{sign}{whole}.{rest:03d}"
