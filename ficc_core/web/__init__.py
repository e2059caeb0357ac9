"""The operator's web console: HTML shells, their templates and static assets.

The console is a client of the public ``/api/v1`` routes like any other: the server
renders a page's shell (no data but the landing page's settings) and serves the
assets; the page's script reads and changes everything through the API with the
session cookie and the CSRF token the login answered (docs/ui.md). This package
knows nothing of the controller: :mod:`ficc_core.api.routes_web` serves what it
renders.
"""

from __future__ import annotations

from .assets import Asset, Assets
from .pages import (
    CONSOLE_PAGES,
    CONTENT_SECURITY_POLICY,
    PAGE_HEADERS,
    ConsolePage,
    Pages,
    contact_link,
)

__all__ = [
    "CONSOLE_PAGES",
    "CONTENT_SECURITY_POLICY",
    "PAGE_HEADERS",
    "Asset",
    "Assets",
    "ConsolePage",
    "Pages",
    "contact_link",
]
