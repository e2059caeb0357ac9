"""The console's HTML shells: Jinja templates rendered with the landing settings.

A shell holds no data but what every visitor may read (the operator's contact and
notice, the version); the page's module script fetches the rest from ``/api/v1``.
Pages carry a strict Content-Security-Policy: scripts, styles and images from the
server alone, nothing inline, no framing, connections only back to the server.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import jinja2

from .assets import Assets

#: No inline script or style, nothing from elsewhere, never inside a frame.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ]
)
#: The headers of every console page.
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@attrs.frozen(kw_only=True)
class ConsolePage:
    """One page of the console behind the login.

    :ivar name: its name: the route's endpoint is ``web_<name>``, its template
        ``<name>.html`` (extending ``console.html``) and its module ``js/<name>.js``.
    :ivar path: the Quart rule (``/ui/dashboard``, ``/ui/services/<service_id>``).
    :ivar title: what the navigation calls it.
    :ivar nav: it is linked from the navigation (a page for one item is reached from a
        list instead).
    :ivar scope: the scope a session needs to see it in the navigation (``admin``), or
        None for every session; the page itself tells a session without it so, and its
        routes refuse that session anyway.
    """

    name: str
    path: str
    title: str
    nav: bool = True
    scope: str | None = None


#: The console's pages, in navigation order. A page is added here, with its template,
#: its module and its route entry in ``ficc_core.api.access`` (``web_<name>``).
CONSOLE_PAGES: tuple[ConsolePage, ...] = (
    ConsolePage(name="dashboard", path="/ui/dashboard", title="Dashboard"),
    ConsolePage(name="services", path="/ui/services", title="Services"),
    ConsolePage(name="service", path="/ui/services/<service_id>", title="Service", nav=False),
    ConsolePage(name="models", path="/ui/models", title="Models"),
    ConsolePage(name="chat", path="/ui/chat", title="Chat"),
    ConsolePage(name="keys", path="/ui/keys", title="Keys"),
    ConsolePage(name="usage", path="/ui/usage", title="Usage"),
    ConsolePage(name="admin", path="/ui/admin", title="Administration", scope="admin"),
)


_EMAIL = re.compile(r"[^@\s/:]+@[^@\s/]+\.[^@\s/]+")
_URL = re.compile(r"https?://\S+", re.IGNORECASE)


def contact_link(contact: str) -> tuple[str | None, str]:
    """``(href, text)`` for the landing page's contact: a ``mailto:`` link for an e-mail
    address, the URL itself for an http(s) URL, no link (``None``) for anything else."""
    text = contact.strip()
    if text.lower().startswith("mailto:") and _EMAIL.fullmatch(text[7:]):
        return text, text[7:]
    if _EMAIL.fullmatch(text):
        return "mailto:" + text, text
    if _URL.fullmatch(text):
        return text, text
    return None, text


@attrs.define
class Pages:
    """Renders the console's pages; :meth:`render` gives a page's HTML."""

    assets: Assets
    contact: str = ""
    notice: str = ""
    refresh: float = 5.0
    version: str = ""
    env: jinja2.Environment = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader(__package__, "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals["asset"] = self.assets.url
        self.env.globals["console_pages"] = [page for page in CONSOLE_PAGES if page.nav]

    def render(self, template: str, **context: Any) -> str:
        """The HTML of ``template`` (``landing.html``) with the console's settings."""
        href, text = contact_link(self.contact)
        return self.env.get_template(template).render(
            contact_href=href,
            contact_text=text,
            notice=self.notice.strip(),
            refresh_ms=max(250, round(self.refresh * 1000)),
            version=self.version,
            **context,
        )
