"""What ``ficc serve`` checks before it starts, and refusals an operator can act on.

Everything that would stop the controller from serving is found first, in this order:
the directories it writes (``data_dir``, ``agent_dir``, ``runtime_dir``), then its
listening ports, which it binds and keeps: only then does it open the store and take
the leader lease, so a controller that cannot serve never holds the lease. Each
refusal is one :class:`StartupRefused` line naming the cause and the flag,
environment variable and setting that change it; ``ficc serve --debug`` adds the
traceback.
"""

from __future__ import annotations

import errno
import socket
import tempfile
from pathlib import Path

import attrs

from ..config import Config
from ..executor.errors import RuntimeDirUnusable
from ..executor.runtime_dir import ensure_runtime_dir

__all__ = ["Listeners", "StartupRefused", "bind_listeners", "check_directories", "store_hint"]


class StartupRefused(Exception):
    """``ficc serve`` cannot start; the message says why and what changes it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _writable(path: Path, what: str, how: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise StartupRefused(
            f"cannot write the {what} {path}: {exc.strerror or exc}; {how}"
        ) from None


def check_directories(config: Config, *, embedded_agent: bool) -> None:
    """Refuse a data, agent or runtime directory this user cannot write (blocking)."""
    _writable(
        config.data_dir,
        "data directory",
        "choose another with --data-dir (FICC_DATA_DIR, setting data_dir) or fix its permissions",
    )
    if not embedded_agent:
        return
    _writable(
        config.agent_path,
        "agent directory",
        "choose another with --agent-dir (FICC_AGENT_DIR, setting agent_dir) or fix its "
        "permissions",
    )
    try:
        ensure_runtime_dir(config.runtime_path)
    except RuntimeDirUnusable as exc:
        raise StartupRefused(exc.message) from None


@attrs.frozen
class Listeners:
    """The sockets ``ficc serve`` bound before anything else, as hypercorn binds
    (``fd://N``): the API's and, with ``metrics_listen``, the metrics listener's."""

    api: str
    metrics: str | None = None


def _bind(host: str, port: int, what: str, fix: str) -> str:
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # The socket hypercorn would have made for this bind (an IPv6 one for a host with ":").
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # As hypercorn sets it on the sockets it binds (accepted ones inherit it).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if isinstance(exc, socket.gaierror):
            cause = f"{host!r} does not resolve to an address ({exc.strerror})"
        elif exc.errno == errno.EADDRINUSE:
            cause = "the port is already in use (another ficc serve?)"
            fix = f"{fix}, or stop what holds it"
        elif exc.errno == errno.EACCES:
            cause = "ports below 1024 need privileges"
        elif exc.errno == errno.EADDRNOTAVAIL:
            cause = f"{host} is not an address of this machine"
        else:
            cause = exc.strerror or str(exc)
        raise StartupRefused(f"cannot listen on {address} for the {what}: {cause}; {fix}") from None
    return f"fd://{sock.detach()}"


def bind_listeners(config: Config) -> Listeners:
    """Bind the API's port (and the metrics listener's); hypercorn listens on them later."""
    api = _bind(
        config.host,
        config.port,
        "API",
        "choose another port with --port N (FICC_PORT, setting port; 0 lets the system "
        "choose) or another address with --host (FICC_HOST)",
    )
    metrics = None
    if config.metrics_listen is not None:
        host, _, port = config.metrics_listen.rpartition(":")
        metrics = _bind(
            host.strip("[]"),
            int(port),
            "metrics listener",
            "choose another host:port with --metrics-listen (FICC_METRICS_LISTEN, setting "
            "metrics_listen)",
        )
    return Listeners(api=api, metrics=metrics)


def store_hint(config: Config) -> str:
    """What changes the store ``ficc serve`` could not open."""
    if config.database_url:
        return (
            "check that PostgreSQL runs and accepts this user, or change --database-url "
            "(FICC_DATABASE_URL, setting database_url)"
        )
    return (
        "choose another data directory with --data-dir (FICC_DATA_DIR, setting data_dir) "
        "or fix its permissions"
    )
