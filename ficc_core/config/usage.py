"""Usage records (docs/usage.md): how they are buffered and written to the store."""

from __future__ import annotations

import attrs

from .fields import setting


@attrs.frozen(slots=False)
class UsageSettings:
    """Buffering and writing usage records (a section of Config)."""

    usage_flush_interval: float = setting(
        1.0,
        "How often buffered usage records are written to the store; each is in the "
        "controller's spool (data_dir/usage-spool) at once, so a killed controller's "
        "are written at the next start (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    usage_batch_size: int = setting(
        500,
        "Usage records written in one transaction; a fuller buffer is written at once.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    usage_buffer_size: int = setting(
        100_000,
        "Usage records held while the store is slow or down. Beyond it records are "
        "aggregated per key, then dropped (counted and logged) rather than blocking a "
        "request: losing accounting is bad, turning a stalled database into an outage "
        "is worse.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
