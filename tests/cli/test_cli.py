"""The ``ficc`` command line: help for every setting, admin commands on the data directory."""

from __future__ import annotations

import json
import re

import attrs
import pytest
import trio
from click.testing import CliRunner

from ficc_core.cli.main import cli
from ficc_core.config import Config, env_name, load_config
from ficc_core.controller.service import open_service

from ..support.serve_support import make_data_dir


@pytest.fixture
def run(tmp_path):
    """``ficc --data-dir D ...`` on a data directory that ``ficc serve`` made (its database)."""
    make_data_dir(tmp_path / "data")
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        result = runner.invoke(
            cli, ["--data-dir", str(tmp_path / "data"), *args], input=input, env={}
        )
        return result

    return invoke


def test_serve_help_explains_every_setting():
    result = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for field in attrs.fields(Config):
        flag = "--" + field.name.replace("_", "-")
        assert flag in result.output, flag
        assert env_name(field) in result.output
    # The global options are there too: `ficc serve --data-dir D` as `ficc --data-dir D serve`.
    assert "--config FILE" in result.output and "--data-dir DIRECTORY" in result.output


def test_top_level_help_lists_the_commands():
    result = CliRunner().invoke(cli, ["--help"])
    for command in ("serve", "plugins", "admin", "config"):
        assert re.search(rf"^\s+{command}\s", result.output, re.M), command


def test_admin_creates_projects_users_and_tokens_that_authenticate(run, tmp_path):
    assert run("admin", "create-project", "team-a").exit_code == 0
    listed = json.loads(run("admin", "list-projects", "--json").output)
    assert [p["name"] for p in listed] == ["team-a"]

    result = run(
        "admin",
        "create-token",
        "--project",
        "team-a",
        "--scope",
        "models:read",
        "--scope",
        "inference:read",
        "--expires-in",
        "1h",
    )
    assert result.exit_code == 0, result.output
    assert re.search(
        r"^credential \S+ \(cli\): inference:read, models:read; expires 20", result.output
    )
    token = re.search(r"token \(shown once\): (\S+)", result.output).group(1)
    record = json.loads(run("admin", "list-tokens", "--project", "team-a", "--json").output)[0]
    assert record["scopes"] == ["inference:read", "models:read"]
    assert record["expires_at"] is not None

    config = load_config(overrides={"data_dir": str(tmp_path / "data")}, environ={})

    async def check():
        async with open_service(config) as service:
            return await service.auth.authenticate_bearer(token)

    principal = trio.run(check)
    assert principal.project_name == "team-a"
    assert principal.scopes == {"models:read", "inference:read"}

    assert run("admin", "revoke-token", record["id"]).exit_code == 0
    tokens = json.loads(run("admin", "list-tokens", "--project", "team-a", "--json").output)
    assert tokens[0]["revoked_at"] is not None


def test_admin_create_user_reads_a_password_from_stdin(run):
    run("admin", "create-project", "p")
    result = run(
        "admin",
        "create-user",
        "carol",
        "--project",
        "p",
        "--scope",
        "models:read",
        "--password-stdin",
        "--json",
        input="carol-password\n",
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["password"] is None
    user = document["user"]
    assert user["projects"][0]["scopes"] == ["models:read"]
    assert "shown once" not in result.output


def test_admin_refusals_are_clear_and_nonzero(run, tmp_path):
    missing = run("admin", "create-token", "--project", "nope", "--scope", "models:read")
    assert missing.exit_code != 0
    assert "no project 'nope'" in missing.output
    assert f"(data directory {tmp_path / 'data'})" in missing.output
    no_scope = run("admin", "create-token", "--project", "nope")
    assert no_scope.exit_code != 0
    assert "--scope" in no_scope.output
    run("admin", "create-project", "dup")
    dup = run("admin", "create-project", "dup")
    assert dup.exit_code != 0 and "already exists" in dup.output


def test_config_prints_the_effective_settings(run):
    result = run("config", "--json")
    assert result.exit_code == 0
    document = json.loads(result.output)
    assert set(document) == {field.name for field in attrs.fields(Config)}
    assert document["data_dir"].endswith("data")
