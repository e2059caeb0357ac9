"""Credentials and logins (docs/api.md#authenticating): lifetimes, lockouts, cookies, TLS."""

from __future__ import annotations

from pathlib import Path

import attrs

from .fields import setting


@attrs.frozen(slots=False)
class AuthSettings:
    """Credentials, logins and TLS (a section of Config)."""

    token_max_lifetime: float = setting(
        90 * 86400.0,
        "The longest a bearer credential lives, however it is minted (API, CLI, first run); "
        "a longer or absent lifetime is capped to it, as to the issuer's own expiry (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    first_run_secrets: str = setting(
        "file",
        "Where the first run puts the admin password and token: 'file' writes "
        "data_dir/first-run-secrets (mode 0600) and logs only its path; 'stdout' prints them.",
        kind="str",
        validator=attrs.validators.in_(("file", "stdout")),
    )
    login_max_failures: int = setting(
        5,
        "Wrong passwords for one user from one client address before that pair is locked "
        "(four times as many per address and per user from untrusted addresses).",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    login_lockout: float = setting(
        60.0,
        "How long a login lock lasts; each further failure doubles it, up to 64 times (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    secure_cookies: bool = setting(
        False,
        "Mark session cookies Secure (only sent over HTTPS). Always on when TLS is configured.",
        kind="bool",
    )
    tls_certfile: Path | None = setting(
        None,
        "PEM certificate chain; with tls_keyfile, the service speaks HTTPS.",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    tls_keyfile: Path | None = setting(
        None,
        "PEM private key for tls_certfile.",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
