"""The authentication package's series: login locks."""

from __future__ import annotations

import prometheus_client as prom


class AuthMetrics:
    """Authentication's collectors, registered in ``registry``."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        self.login_lockouts = prom.Counter(
            "ficc_login_lockouts",
            "Login locks after repeated wrong passwords, by the limit reached "
            "(user_address, address or user).",
            ("limit",),
            registry=registry,
        )
