"""`ficc login`, `ficc logout`, `ficc whoami` and the global options, against a real `ficc serve`.

The CLI runs in a worker thread (click's runner) while `ficc serve` is a subprocess;
no FICC_URL or FICC_TOKEN is set, so every command after login finds the stored one.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

import httpx
import pytest
import trio
from click.testing import CliRunner, Result

from ficc_core.cli import credentials
from ficc_core.cli.main import cli

from .serve_support import ServeProcess, make_data_dir

NO_ENV = {"FICC_URL": None, "FICC_TOKEN": None, "FICC_DATA_DIR": None, "FICC_CONFIG": None}


async def ficc(*args: str, input: str | None = None) -> Result:
    runner = CliRunner()
    return await trio.to_thread.run_sync(
        lambda: runner.invoke(cli, list(args), input=input, env=NO_ENV)
    )


async def ok(*args: str, input: str | None = None) -> Result:
    result = await ficc(*args, input=input)
    assert result.exit_code == 0, (args, result.stdout, result.stderr, result.exception)
    return result


async def as_json(*args: str) -> Any:
    return json.loads((await ok(*args, "--json")).stdout)


@pytest.fixture
async def server(tmp_path):
    """`ficc serve` on a fresh data directory given AFTER the subcommand; its URL and secrets."""
    data = tmp_path / "elsewhere"
    serve = ServeProcess(
        tmp_path / "not-this-one", "--data-dir", str(data), "--first-run-secrets", "stdout"
    )
    try:
        url = await serve.wait_ready()
        with trio.fail_after(30):
            password = await serve.read_until(r"admin password:\s+(\S+)")
            token = await serve.read_until(r"admin token:\s+(\S+)")
            await serve.read_until(r"(ficc admin create-token .*)")
        yield {"url": url, "password": password, "token": token, "data": data, "serve": serve}
    finally:
        serve.proc.terminate()
        serve.kill()


def whoami_status(url: str, token: str) -> tuple[int, str]:
    response = httpx.get(f"{url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    return response.status_code, response.json().get("error", {}).get("code", "")


async def test_serve_takes_data_dir_after_the_subcommand_and_its_hints_name_it(server, tmp_path):
    text = "".join(server["serve"].lines)
    assert f"data directory: {server['data']}" in text
    assert (server["data"] / "ficc.sqlite3").is_file()
    assert not (tmp_path / "not-this-one").exists()  # the flag beats FICC_DATA_DIR
    # Run as printed, each hint reaches this installation.
    assert f"ficc login {server['url']} --username admin" in text
    hint = re.search(r"(ficc admin create-token .*)", text).group(1)
    assert hint.endswith(f"--data-dir {server['data']}")
    created = await ok(*hint.split()[1:])
    assert "token (shown once): ficc_" in created.stdout


async def test_login_with_a_password_stores_a_private_credential_and_logout_revokes_it(server):
    url = server["url"]
    logged_in = await ok(
        "login", url, "--username", "admin", "--password-stdin", input=(server["password"] + "\n")
    )
    assert f"logged in to {url} as admin in project default" in logged_in.stdout
    path = credentials.path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    stored = credentials.load()
    login = stored.servers[url]
    assert stored.current == url and login.minted and login.session

    # Every client command now finds it: no --url, --token or environment.
    shown = await ok("whoami")
    assert re.search(r"^user:\s+admin \(administrator\)$", shown.stdout, re.M)
    assert str(path) in shown.stdout
    principal = await as_json("whoami")
    assert principal["id"] == login.credential_id and principal["user"]["username"] == "admin"
    # Minted by a session: it lives no longer than the session does (session_lifetime 12 h).
    assert principal["expires_at"] - (await trio.to_thread.run_sync(_now)) <= 12 * 3600 + 5
    assert (await as_json("inference", "list")) == {"services": []}
    assert (await as_json("models", "list")) == {"models": []}

    logged_out = await ok("logout")
    assert f"revoked and forgot credential {login.credential_id}" in logged_out.stdout
    assert not path.exists()
    assert await trio.to_thread.run_sync(whoami_status, url, login.token) == (
        401,
        "credential_revoked",
    )
    refused = await ficc("whoami")
    assert refused.exit_code == 2 and "run 'ficc login" in refused.stderr
    again = await ficc("logout")
    assert again.exit_code == 1 and "not logged in" in again.stderr


def _now() -> float:
    import time

    return time.time()


async def test_login_with_a_token_mints_its_own_and_logout_leaves_the_given_one(server):
    url, admin = server["url"], server["token"]
    document = await as_json("login", url, "--token", admin)
    assert document["minted"] is True and document["credential"]["issuer_id"]
    minted = credentials.load().servers[url]
    assert minted.token != admin
    assert (await as_json("whoami"))["id"] == minted.credential_id

    # A token that may not mint (no tokens:manage) is stored as given, and never revoked.
    async with httpx.AsyncClient(base_url=url) as http:
        issued = await http.post(
            "/api/v1/tokens",
            headers={"Authorization": f"Bearer {admin}"},
            json={"name": "reader", "scopes": ["inference:read"]},
        )
    limited = issued.json()["token"]
    document = await as_json("login", url, "--token", limited)
    assert document["minted"] is False
    # Logging in again replaced (and revoked) the credential minted before.
    assert await trio.to_thread.run_sync(whoami_status, url, minted.token) == (
        401,
        "credential_revoked",
    )
    assert (await as_json("logout", url))["revoked"] is False
    assert await trio.to_thread.run_sync(whoami_status, url, limited) == (200, "")
    assert await trio.to_thread.run_sync(whoami_status, url, admin) == (200, "")

    wrong = await ficc("login", url, "--username", "admin", "--password-stdin", input="nope\n")
    assert wrong.exit_code == 1 and "[invalid_login]" in wrong.stderr
    assert not credentials.path().exists()


async def test_global_options_before_or_after_the_subcommand(server):
    url, token = server["url"], server["token"]
    for argv in (
        ("--url", url, "--token", token, "inference", "list"),
        ("inference", "--url", url, "--token", token, "list"),
        ("inference", "list", "--url", url, "--token", token),
        ("--url", "http://127.0.0.1:9", "inference", "list", "--url", url, "--token", token),
    ):
        assert (await as_json(*argv)) == {"services": []}, argv
    # The deepest value wins; a bad one there is used.
    result = await ficc("--url", url, "inference", "list", "--url", "http://127.0.0.1:9")
    assert result.exit_code in (1, 2) and "127.0.0.1:9" in result.stderr
    # --data-dir before or after, on admin and config.
    data = str(server["data"])
    for argv in (
        ("--data-dir", data, "admin", "list-projects"),
        ("admin", "list-projects", "--data-dir", data),
    ):
        assert [p["name"] for p in await as_json(*argv)] == ["default"], argv
    assert (await as_json("config", "--data-dir", data))["data_dir"] == data


def test_admin_refuses_to_create_a_database_and_names_the_path(tmp_path):
    missing = tmp_path / "typo"
    for argv in (
        ("admin", "list-projects"),
        ("admin", "create-token", "--project", "default", "--all-scopes"),
        ("admin", "create-project", "p"),
    ):
        result = CliRunner().invoke(cli, [*argv, "--data-dir", str(missing)], env=NO_ENV)
        assert result.exit_code == 1, (argv, result.output)
        assert f"no FICC database at {missing / 'ficc.sqlite3'}" in result.stderr
        assert f"'ficc serve --data-dir {missing}'" in result.stderr
    assert not missing.exists()


def test_the_credentials_file_is_replaced_whole_and_survives_odd_urls(tmp_path):
    url = 'http://[::1]:8484/"quoted"'
    credentials.store(url, credentials.Login(token="t\\1", credential_id="c1", minted=True))
    credentials.store("http://b", credentials.Login(token="t2", credential_id="c2"))
    stored = credentials.load()
    assert stored.current == "http://b"
    assert stored.servers[url] == credentials.Login(token="t\\1", credential_id="c1", minted=True)
    assert os.listdir(credentials.path().parent) == ["credentials.toml"]  # no temporary left
    credentials.forget("http://b")
    assert credentials.load().current == url
    credentials.forget(url)
    assert not credentials.path().exists()


def test_unreadable_credentials_file_is_a_clear_error(tmp_path):
    path = credentials.path()
    path.parent.mkdir(parents=True)
    path.write_text("current = \n")
    result = CliRunner().invoke(cli, ["whoami"], env=NO_ENV)
    assert result.exit_code == 1 and f"cannot read the stored logins in {path}" in result.stderr


def test_json_everywhere_without_a_server(tmp_path):
    """--json on the families that need no controller: config, plugins, admin."""
    data = tmp_path / "data"
    make_data_dir(data)
    runner = CliRunner()

    def parsed(*argv: str) -> Any:
        result = runner.invoke(cli, [*argv, "--json", "--data-dir", str(data)], env=NO_ENV)
        assert result.exit_code == 0, (argv, result.output)
        return json.loads(result.stdout)

    assert parsed("config")["data_dir"] == str(data)
    assert "plugins" in parsed("plugins")
    assert parsed("admin", "create-project", "p")["name"] == "p"
    assert [p["name"] for p in parsed("admin", "list-projects")] == ["p"]
    issued = parsed("admin", "create-token", "--project", "p", "--scope", "models:read")
    assert issued["token"].startswith("ficc_") and issued["credential"]["scopes"] == ["models:read"]
    assert parsed("admin", "list-tokens", "--project", "p")[0]["id"] == issued["credential"]["id"]
    assert parsed("admin", "revoke-token", issued["credential"]["id"])["revoked_at"] is not None
    user = parsed("admin", "create-user", "carol", "--project", "p")
    assert user["user"]["username"] == "carol" and len(user["password"]) == 24
    node = parsed("admin", "add-node", "n1")
    assert node["credential"] and parsed("admin", "list-nodes")[0]["name"] == "n1"
    assert parsed("admin", "revoke-node", node["node"]["id"])["revoked_at"] is not None
    # Human output by default: a table, not JSON.
    table = runner.invoke(cli, ["admin", "list-projects", "--data-dir", str(data)], env=NO_ENV)
    assert re.match(r"^ID\s+NAME\s+BAND\s+CREATED$", table.stdout.splitlines()[0])
