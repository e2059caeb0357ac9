"""A real PostgreSQL server for the tests, in a temporary directory.

One server per test session (:func:`session_server`), and a fresh empty database per
test (:meth:`PostgresServer.create_database`, from ``template0``, dropped after). A test
that stops the server (an outage) starts one of its own instead.

Debian's binaries (``/usr/lib/postgresql/<version>/bin``) are used. ``initdb`` and
``postgres`` refuse to run as root, and CI runs as root: there they run as the
``postgres`` user (``runuser -u postgres --``), with the data and socket directories in
a temporary directory handed to that user. (The ``pytest-postgresql`` plugin runs
``pg_ctl`` as the current user, which PostgreSQL refuses to root, so it is not used.)
TCP is on 127.0.0.1 with a free port; authentication is ``trust`` (loopback only). A
server left running by a test run that was killed is stopped by the next session
(:func:`reap_stale`).

Without the binaries, PostgreSQL tests are skipped locally with the reason, and fail
under ``CI=true`` (CI installs them: .ci/run).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

USER = "postgres"


def find_bin() -> Path | None:
    """The newest Debian PostgreSQL ``bin`` directory with ``initdb``, if any."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(Path(path).parent.parent.name),
    )
    return Path(found[-1]).parent if found else None


def missing() -> str | None:
    """Why a PostgreSQL server cannot be started here (``None`` when it can)."""
    if find_bin() is None:
        return (
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): "
            "apt-get install postgresql"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(USER)
        except KeyError:
            return f"running as root and there is no {USER!r} user to run PostgreSQL as"
    return None


def unavailable(reason: str) -> None:
    """Skip the test for ``reason``; under CI, where PostgreSQL is installed, fail it."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL tests must run in CI: {reason}")
    pytest.skip(reason)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists, whichever user it runs as."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale() -> None:
    """Stop the servers of test runs that died without stopping theirs (killed, say):
    each server's directory names the process that started it (``owner``); one whose
    owner is gone is stopped and removed. Servers of runs still going are left alone."""
    for root in Path(tempfile.gettempdir()).glob("ficc-pg-*"):
        try:
            owner = int((root / "owner").read_text())
        except (OSError, ValueError):
            continue
        if pid_alive(owner):
            continue
        try:
            postmaster = int((root / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            postmaster = 0
        if postmaster and pid_alive(postmaster):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(postmaster, signal.SIGINT)  # fast shutdown
            deadline = time.monotonic() + 30
            while pid_alive(postmaster) and time.monotonic() < deadline:
                time.sleep(0.05)  # polling for the process to end, bounded
        shutil.rmtree(root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """One PostgreSQL cluster in its own temporary directory, as the ``postgres`` user
    when this process is root."""

    def __init__(self) -> None:
        bin_dir = find_bin()
        assert bin_dir is not None, missing()
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="ficc-pg-"))
        (self.root / "owner").write_text(str(os.getpid()))  # for reap_stale
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "postgres.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", USER, "--"]
            entry = pwd.getpwnam(USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.sockets.mkdir()
        if self._as_user:
            os.chown(self.sockets, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            [
                *self._as_user,
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URL for ``dbname`` on this server."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (on its previous port when it ran before) and wait until it
        accepts connections."""
        attempts = 1 if self.port else 3
        for attempt in range(attempts):
            port = self.port or _free_port()
            log = open(self.log, "ab")  # the server's output (the child keeps its own copy)
            self.proc = subprocess.Popen(
                [
                    *self._as_user,
                    str(self.bin / "postgres"),
                    "-D",
                    str(self.data),
                    "-k",
                    str(self.sockets),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=300",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            if self._wait_ready(port, timeout):
                self.port = port
                return
            if attempt + 1 == attempts:
                break
        tail = self.log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"PostgreSQL did not start; its log ends:\n{tail}")

    def _wait_ready(self, port: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        url = f"postgresql://{USER}@127.0.0.1:{port}/postgres"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False  # it exited: the port was taken, or see the log
            try:
                psycopg.connect(url, connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.05)  # polling for readiness, bounded by the deadline
        self.stop()
        return False

    def stop(self) -> None:
        """Stop the server (fast shutdown: connections are cut, nothing is lost)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.proc = None

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def admin(self) -> psycopg.Connection:
        """An autocommit connection to the ``postgres`` database (create, drop)."""
        return psycopg.connect(self.url(), autocommit=True, connect_timeout=5)

    def create_database(self) -> str:
        """A fresh empty database (from template0); return its name."""
        name = "ficc_test_" + secrets.token_hex(6)
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, cutting any connection still open to it."""
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
