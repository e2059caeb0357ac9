"""Conformance kits third parties run against their own plugins.

``ficc_core.testing.adapter_kit`` (:func:`check_adapter`) checks an engine adapter
against the adapter contract: API version, purity (no I/O, deterministic),
admitted inputs only, endpoint contract and readiness probe, known capabilities.

``ficc_core.testing.executor_kit`` checks an executor provider against the
executor contract, using the stand-in engine in ``ficc_core.testing.standin_engine``.

Names are resolved on first use, so running the stand-in engine
(``python -m ficc_core.testing.standin_engine``) imports nothing but the standard library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AdapterCase": "ficc_core.testing.adapter_kit",
    "AdapterConformanceError": "ficc_core.testing.adapter_kit",
    "check_adapter": "ficc_core.testing.adapter_kit",
    "make_case": "ficc_core.testing.adapter_kit",
    "make_placement": "ficc_core.testing.adapter_kit",
    "make_specification": "ficc_core.testing.adapter_kit",
}

__all__ = [
    "AdapterCase",
    "AdapterConformanceError",
    "check_adapter",
    "make_case",
    "make_placement",
    "make_specification",
]

if TYPE_CHECKING:
    from .adapter_kit import (
        AdapterCase,
        AdapterConformanceError,
        check_adapter,
        make_case,
        make_placement,
        make_specification,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ficc_core.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
