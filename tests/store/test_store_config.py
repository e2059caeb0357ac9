"""The store's settings: database_url chooses the backend, is validated, and its password
is never printed by `ficc config`; without PostgreSQL its tests skip, except in CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ficc_core.base.errors import ConfigError
from ficc_core.cli.main import cli
from ficc_core.config import load_config
from ficc_core.store import is_postgres_url, redact_url

from ..support import pg_support


def test_database_url_defaults_to_sqlite_and_takes_a_postgresql_url_from_the_environment():
    config = load_config(environ={})
    assert (config.database_url, config.store_pool_size, config.store_pool_timeout) == ("", 10, 5)
    env = {
        "FICC_DATABASE_URL": "postgresql://ficc@db.internal:5432/ficc",
        "FICC_STORE_POOL_SIZE": "4",
        "FICC_STORE_POOL_TIMEOUT": "250ms",
    }
    config = load_config(environ=env)
    assert is_postgres_url(config.database_url)
    assert (config.store_pool_size, config.store_pool_timeout) == (4, 0.25)


@pytest.mark.parametrize(
    "env",
    [
        {"FICC_DATABASE_URL": "mysql://root@db/ficc"},
        {"FICC_DATABASE_URL": "/var/lib/ficc/ficc.sqlite3"},
        {"FICC_STORE_POOL_SIZE": "0"},
        {"FICC_STORE_POOL_TIMEOUT": "0"},
    ],
)
def test_bad_store_settings_are_refused(env):
    with pytest.raises(ConfigError):
        load_config(environ=env)


def test_a_password_in_the_url_is_redacted():
    assert redact_url("postgresql://ficc:s3cret@db:5432/ficc?sslmode=require") == (
        "postgresql://ficc:***@db:5432/ficc?sslmode=require"
    )
    assert redact_url("postgres://ficc@db/ficc?password=s3cret&sslmode=verify-full") == (
        "postgres://ficc@db/ficc?password=***&sslmode=verify-full"
    )
    assert redact_url("postgresql://db/ficc") == "postgresql://db/ficc"
    assert redact_url("") == ""


def test_ficc_config_never_prints_the_database_password(tmp_path):
    env = {"FICC_DATA_DIR": str(tmp_path), "FICC_DATABASE_URL": "postgresql://u:s3cret@db/f"}
    result = CliRunner().invoke(cli, ["config", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["database_url"] == "postgresql://u:***@db/f"
    assert "s3cret" not in result.output
    human = CliRunner().invoke(cli, ["config"], env=env)
    assert "s3cret" not in human.output and "u:***@db" in human.output


def test_missing_postgresql_skips_the_tests_locally_and_fails_them_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run in CI: no binaries"):
        pg_support.unavailable("no binaries")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no binaries"):
        pg_support.unavailable("no binaries")


def test_a_server_left_by_a_killed_test_run_is_reaped():
    """A test process killed before its fixtures ran leaves its server; the next session
    stops it (and only servers whose starting process is gone)."""
    reason = pg_support.missing()
    if reason is not None:
        pg_support.unavailable(reason)
    script = (
        "import sys, time; sys.path.insert(0, sys.argv[1])\n"
        "from tests.support.pg_support import PostgresServer\n"
        "s = PostgresServer(); s.start(); print(s.root, flush=True); time.sleep(600)\n"
    )
    repo = str(Path(__file__).resolve().parents[2])
    # Its server starts within its own bound (60 s), or it exits and the line is empty.
    proc = subprocess.Popen([sys.executable, "-c", script, repo], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line, "the server did not start"
        root = Path(line)
        postmaster = int((root / "data" / "postmaster.pid").read_text().split()[0])
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    pg_support.reap_stale()
    assert not root.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(postmaster, 0)
