"""``ficc login``, ``ficc logout``, ``ficc whoami``: a stored credential instead of exports.

``ficc login URL`` mints a bearer credential for the command line and stores it
(:mod:`.credentials`); every client command then finds it when neither ``--token``
nor ``FICC_TOKEN`` is given. With ``--username`` a session opened with the user's
password (``POST /api/v1/session``) mints a *lasting* credential (``lasting``: it
outlives the session, which login ends at once) carrying the user's scopes in the
project and living ``--lifetime`` (capped at ``token_max_lifetime``, and said so);
with ``--token T`` it is minted by ``T`` (and expires with it), or ``T`` itself is
stored when it may not mint (no ``tokens:manage``). ``ficc logout`` revokes what
login minted and forgets it; a token you gave is forgotten, never revoked.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import sys
from typing import Any

import click

from ..base.errors import FiccError
from ..config import parse_duration
from . import credentials
from .client import ApiClient, ApiError, client_from
from .options import DEFAULT_URL, connection, given
from .output import echo_fields, emit, hint, json_option, when

_SESSION_COOKIE = "ficc_session"


def _target(ctx: click.Context, url: str | None) -> str:
    return (url or given(ctx, "url") or os.environ.get("FICC_URL") or DEFAULT_URL).rstrip("/")


def _credential_name() -> str:
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())
    return f"ficc-login-{host}"[:64]


def _mint(
    client: ApiClient, scopes: list[str], lifetime: float, name: str | None, *, lasting: bool
) -> dict[str, Any]:
    """Mint the command line's credential called ``name``; with no name given, the
    host's default, or (a live one of this host has it, as a login elsewhere made it)
    that name with a random suffix."""
    body: dict[str, Any] = {"scopes": scopes, "lifetime": lifetime}
    if lasting:
        body["lasting"] = True
    try:
        return client.json(
            "POST", "/api/v1/tokens", json={**body, "name": name or _credential_name()}
        )
    except ApiError as exc:
        if name is not None or exc.code != "credential_name_taken":
            raise
    suffix = f"-{secrets.token_hex(3)}"
    unique = _credential_name()[: 64 - len(suffix)] + suffix
    return client.json("POST", "/api/v1/tokens", json={**body, "name": unique})


def _session_client(url: str, session: str, csrf: str) -> ApiClient:
    return ApiClient(
        url, None, headers={"Cookie": f"{_SESSION_COOKIE}={session}", "X-CSRF-Token": csrf}
    )


def _password_login(
    url: str, username: str, password: str, project: str, lifetime: float, name: str | None
) -> tuple[dict[str, Any], credentials.Login]:
    """Open a session with the password, mint a lasting credential with it, end it."""
    answer = ApiClient(url, None, headers={}).call(
        "POST",
        "/api/v1/session",
        json={"username": username, "password": password, "project": project},
    )
    session, csrf = answer.cookies.get(_SESSION_COOKIE), answer.json()["csrf_token"]
    principal = answer.json()["principal"]
    if not session:
        raise click.ClickException(f"{url} answered the login without a session cookie")
    opened = _session_client(url, session, csrf)
    try:
        issued = _mint(opened, principal["scopes"], lifetime, name, lasting=True)
    except ApiError as exc:
        if exc.code == "missing_scope":
            raise click.ClickException(
                f"user {username!r} lacks tokens:manage in project {project!r}, which login "
                "needs to mint the command line's credential; ask an administrator for it, or "
                "log in with --token [missing_scope]"
            ) from None
        raise
    finally:
        # The credential outlives the session (lasting): nothing more needs it.
        try:
            opened.call("DELETE", "/api/v1/session")
        except click.ClickException:
            pass  # it expires by itself
    credential = issued["credential"]
    return issued, credentials.Login(
        token=issued["token"],
        credential_id=credential["id"],
        minted=True,
        project=principal["project"]["name"],
        username=username,
        expires_at=credential["expires_at"],
    )


def _token_login(
    url: str, token: str, lifetime: float, name: str | None
) -> tuple[dict[str, Any] | None, credentials.Login]:
    client = ApiClient(url, token)
    principal = client.json("GET", "/api/v1/whoami")
    user = principal.get("user") or {}
    if "tokens:manage" in principal["scopes"] and principal.get("service_id") is None:
        issued = _mint(client, principal["scopes"], lifetime, name, lasting=False)
        token, credential_id = issued["token"], issued["credential"]["id"]
        expires_at = issued["credential"]["expires_at"]
    else:
        issued, credential_id, expires_at = None, principal["id"], principal["expires_at"]
    return issued, credentials.Login(
        token=token,
        credential_id=credential_id,
        minted=issued is not None,
        project=principal["project"]["name"],
        username=user.get("username"),
        expires_at=expires_at,
    )


def _end(url: str, login: credentials.Login) -> bool:
    """Revoke what ``ficc login`` minted for ``url`` (best effort); whether it was revoked."""
    if not login.minted:
        return False
    revoked = False
    try:
        ApiClient(url, login.token).call("DELETE", f"/api/v1/tokens/{login.credential_id}")
        revoked = True
    except ApiError as exc:
        if exc.status == 401:  # revoked or expired already
            revoked = True
        else:
            hint(f"warning: could not revoke {login.credential_id}: {exc.message}")
    except click.ClickException as exc:
        hint(
            f"warning: could not revoke {login.credential_id} ({exc.message}); "
            f"it expires {when(login.expires_at)}"
        )
    if login.session and login.csrf:
        try:
            _session_client(url, login.session, login.csrf).call("DELETE", "/api/v1/session")
        except click.ClickException:
            pass  # ended or expired already, or unreachable: it expires by itself
    return revoked


def _password(from_stdin: bool) -> str:
    """The password: asked for without echo on a terminal, else standard input's first line."""
    if not from_stdin and sys.stdin.isatty():
        return click.prompt("Password", hide_input=True, err=True)
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise click.UsageError(
            "no password on standard input: pipe it (printf '%s\\n' \"$PASSWORD\" | ficc login "
            "--username NAME --password-stdin), or run ficc login in a terminal to be asked"
        )
    return password


def span(seconds: float) -> str:
    """A lifetime in the largest whole unit: 90d, 12h, 15m, 40s."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.0f}s"


def _capped(capped: dict[str, Any], asked: str) -> str:
    """Why the credential lives less than asked, and what to do about it."""
    granted = span(capped["granted"])
    if capped["by"] == "token_max_lifetime":
        return (
            f"note: --lifetime {asked} was capped to {granted}, the longest this server "
            "grants (its token_max_lifetime setting); log in again before it expires"
        )
    return (
        f"note: --lifetime {asked} was capped to {granted}, when the token that minted it "
        "expires (a credential never outlives what minted it)"
    )


@click.command("login")
@click.argument("url", required=False)
@click.option("--token", "token", help="Log in with this bearer credential.")
@click.option("--username", help="Log in as this user (the password is asked for).")
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from standard input (as when it is not a terminal).",
)
@click.option(
    "--project", default="default", show_default=True, help="The project to work in (--username)."
)
@click.option(
    "--lifetime",
    default="30d",
    show_default=True,
    help="How long the minted credential lives; capped by token_max_lifetime (and, with "
    "--token, by that token's own expiry), and said so.",
)
@click.option(
    "--name",
    help="The minted credential's name, unique in the project [default: ficc-login-HOST].",
)
@json_option
@click.pass_context
def login(
    ctx: click.Context,
    url: str | None,
    token: str | None,
    username: str | None,
    password_stdin: bool,
    project: str,
    lifetime: str,
    name: str | None,
    as_json: bool,
) -> None:
    """Log in to the controller at URL and store a credential for every later command.

    With --username (asked for when neither it nor --token is given) the password
    opens a session that mints the credential with the user's scopes in --project
    and --lifetime, then ends: the credential outlives it. The password is asked for
    without echo on a terminal, else read from standard input. With --token the
    token mints it (or is stored itself when it holds no tokens:manage). The file is
    $XDG_CONFIG_HOME/ficc/credentials.toml (~/.config/ficc/...), mode 0600.
    """
    target = _target(ctx, url)
    try:
        seconds = parse_duration(lifetime)
    except FiccError as exc:
        raise click.BadParameter(exc.message, param_hint="--lifetime") from None
    if token is not None and (username or password_stdin):
        raise click.UsageError("give --token, or --username with a password, not both")
    issued: dict[str, Any] | None  # None: the token given is stored itself
    if token is None:
        username = username or click.prompt("Username", default="admin", err=True)
        password = _password(password_stdin)
        issued, stored = _password_login(target, username, password, project, seconds, name)
    else:
        issued, stored = _token_login(target, token, seconds, name)
    previous = credentials.load().servers.get(target)
    if previous is not None and previous.credential_id != stored.credential_id:
        _end(target, previous)
    path = credentials.store(target, stored)
    principal = ApiClient(target, stored.token).json("GET", "/api/v1/whoami")
    document = {
        "url": target,
        "credentials_file": str(path),
        "minted": stored.minted,
        "principal": principal,
        "credential": None if issued is None else issued["credential"],
    }

    def human(_: Any) -> None:
        who = stored.username or principal["id"]
        click.echo(f"logged in to {target} as {who} in project {stored.project}")
        credential = (issued or {}).get("credential") or {}
        kind = (
            f"a new credential {credential.get('name')}" if stored.minted else "the token you gave"
        )
        click.echo(
            f"stored {kind} ({stored.credential_id}) in {path}, expires {when(stored.expires_at)}"
        )
        if credential.get("capped"):
            hint(_capped(credential["capped"], lifetime))

    emit(document, as_json, human)
    hint("next: 'ficc whoami'; 'ficc models add FILE'; 'ficc logout' ends it")


@click.command("logout")
@click.argument("url", required=False)
@json_option
@click.pass_context
def logout(ctx: click.Context, url: str | None, as_json: bool) -> None:
    """Revoke the credential `ficc login` minted for URL and forget it.

    URL defaults to the controller logged in to last. A token given to
    `ficc login --token` is forgotten here but not revoked.
    """
    stored = credentials.load()
    target = url or given(ctx, "url") or os.environ.get("FICC_URL") or stored.current or ""
    target = target.rstrip("/")
    login_ = stored.servers.get(target)
    if login_ is None:
        known = ", ".join(sorted(stored.servers)) or "none"
        raise click.ClickException(
            f"not logged in to {target or DEFAULT_URL} (stored logins: {known}; "
            f"file {credentials.path()})"
        )
    revoked = _end(target, login_)
    credentials.forget(target)
    document = {"url": target, "credential_id": login_.credential_id, "revoked": revoked}

    def human(_: Any) -> None:
        what = "revoked and forgot" if revoked else "forgot"
        click.echo(f"logged out of {target}: {what} credential {login_.credential_id}")

    emit(document, as_json, human)


@click.command("whoami")
@json_option
@click.pass_context
def whoami(ctx: click.Context, as_json: bool) -> None:
    """Show who the command line acts as: user, project, scopes, expiry (GET /whoami)."""
    found = connection(ctx)
    principal = client_from(ctx).json("GET", "/api/v1/whoami")

    def human(view: dict[str, Any]) -> None:
        user = view.get("user")
        echo_fields(
            [
                ("controller", found.url),
                ("credential", f"{view['kind']} {view['id']} (from {found.source})"),
                (
                    "user",
                    None
                    if user is None
                    else user["username"] + (" (administrator)" if user["admin"] else ""),
                ),
                ("project", f"{view['project']['name']} ({view['project']['id']})"),
                ("scopes", ", ".join(view["scopes"]) or "none"),
                ("expires", when(view["expires_at"])),
                ("service", view.get("service_id")),
            ]
        )

    emit(principal, as_json, human)
