"""Running `ficc serve` as a real subprocess in tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import pytest
import trio

FICC = [sys.executable, "-m", "ficc_core"]


def ficc_command(env: Mapping[str, str]) -> Callable[..., Awaitable[str]]:
    """``await ficc(*args, stdin="")``: the ``ficc`` executable in its own process with
    ``env``; returns its standard output and error, and fails the test on a non-zero exit."""

    async def ficc(*args: str, stdin: str = "") -> str:
        done = await trio.run_process(
            [*FICC, *args],
            stdin=stdin.encode(),
            capture_stdout=True,
            capture_stderr=True,
            env=dict(env),
            check=False,
        )
        out, err = done.stdout.decode(), done.stderr.decode()
        if done.returncode != 0:
            pytest.fail(f"ficc {' '.join(args)} exited {done.returncode}:\n{out}\n{err}")
        return out + err

    return ficc


def make_data_dir(data_dir: Path) -> None:
    """Create the database in ``data_dir`` as a first ``ficc serve`` does (admin commands
    refuse a data directory without one)."""
    from ficc_core.config import load_config
    from ficc_core.controller.service import open_service

    async def create() -> None:
        async with open_service(load_config(overrides={"data_dir": str(data_dir)}, environ={})):
            pass

    trio.run(create)


def first_run_secrets(path: Path) -> dict[str, str]:
    """The ``key: value`` lines of a first-run secrets file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))


class ServeProcess:
    def __init__(self, data_dir: Path, *extra: str, config: Path | None = None) -> None:
        env = {**os.environ, "FICC_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
        env.pop("FICC_CONFIG", None)
        if config is not None:
            env["FICC_CONFIG"] = str(config)
        self.proc = subprocess.Popen(
            [*FICC, "serve", "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        #: The environment it runs with: ``ficc`` commands given it reach its data.
        self.env = env
        self.lines: list[str] = []

    def cli(self) -> Callable[..., Awaitable[str]]:
        """``await ficc(*args)`` against this server's data directory and configuration."""
        return ficc_command(self.env)

    async def wait_ready(self) -> str:
        """Wait for the listening line; return the API's URL."""
        with trio.fail_after(60):
            return await self.read_until(r"listening on (http://\S+)")

    async def read_until(self, pattern: str) -> str:
        """Read stdout up to the first line matching ``pattern``; return its first group.

        The caller bounds the wait (``trio.fail_after``).
        """

        def read() -> str:
            for line in self.proc.stdout:
                self.lines.append(line)
                match = re.search(pattern, line)
                if match:
                    return match.group(1)
            raise AssertionError(
                f"ficc serve printed nothing matching {pattern!r}: "
                + "".join(self.lines)
                + self.proc.stderr.read()
            )

        return await trio.to_thread.run_sync(read, abandon_on_cancel=True)

    async def admin_token(self) -> str:
        """Read the first-run block after the listening line and return the admin token.

        The token is in the banner (``first_run_secrets = "stdout"``) or in the
        secrets file the banner names (the default).
        """
        with trio.fail_after(30):
            found = await self.read_until(r"((?:admin token|secrets file):\s+\S+)")
        label, _, value = found.partition(":")
        value = value.strip()
        if label == "secrets file":
            return first_run_secrets(Path(value))["admin token"]
        return value

    async def log_in_admin(self, ficc: Callable[..., Awaitable[str]]) -> tuple[str, Path]:
        """Wait for the listening line, read the first run's admin password from the
        secrets file the banner names and ``ficc login`` with it through ``ficc`` (piped,
        ``--password-stdin``); return the API's URL and the secrets file.

        The caller bounds the wait (``trio.fail_after``).
        """
        url = await self.wait_ready()
        secrets_file = Path(await self.read_until(r"secrets file:\s+(\S+)"))
        password = first_run_secrets(secrets_file)["admin password"]
        await ficc("login", url, "--username", "admin", "--password-stdin", stdin=password)
        return url, secrets_file

    async def metrics_url(self) -> str:
        """Read the metrics listener's URL (``metrics_listen``), after the listening line."""
        with trio.fail_after(30):
            return await self.read_until(r"metrics on (http\S+)")

    def read_rest(self) -> str:
        # Not communicate(timeout=...): it reads the raw pipe and skips buffered text.
        self.proc.wait(timeout=30)
        self.lines.append(self.proc.stdout.read())
        return "".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
