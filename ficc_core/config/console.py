"""The web console (docs/ui.md)."""

from __future__ import annotations

import attrs

from .fields import setting


@attrs.frozen(slots=False)
class ConsoleSettings:
    """The web console (a section of Config)."""

    landing_contact: str = setting(
        "",
        "Where someone without an account should go, shown on the console's landing page "
        "at /: an address, a URL or a channel name (rendered as a link when it is an "
        "e-mail address or an http(s) URL, as text otherwise). Empty, the page says to ask "
        "the operator.",
        kind="str",
    )
    landing_notice: str = setting(
        "",
        "An optional line of the operator's own on the landing page, for whatever a visitor "
        "needs to know that the page cannot guess (plain text).",
        kind="str",
    )
    console_refresh: float = setting(
        5.0,
        "How often the console's dashboard polls the API for nodes, services, models and "
        "events while the page is visible (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
