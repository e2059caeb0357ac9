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

from ..support.serve_support import FICC, ServeProcess, make_data_dir

NO_ENV = {"FICC_URL": None, "FICC_TOKEN": None, "FICC_DATA_DIR": None, "FICC_CONFIG": None}
DAY = 86400


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


@pytest.mark.deadline(60)
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


@pytest.mark.deadline(60)
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
    assert stored.current == url and login.minted
    # The session that minted it ended at once: nothing of it is kept.
    assert login.session is None and login.csrf is None

    # Every client command now finds it: no --url, --token or environment.
    shown = await ok("whoami")
    assert re.search(r"^user:\s+admin \(administrator\)$", shown.stdout, re.M)
    assert str(path) in shown.stdout
    principal = await as_json("whoami")
    assert principal["id"] == login.credential_id and principal["user"]["username"] == "admin"
    # It lives as long as --lifetime asks (30 days by default), not the 12 h session's.
    left = principal["expires_at"] - await trio.to_thread.run_sync(_now)
    assert 30 * DAY - 60 < left <= 30 * DAY
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


@pytest.mark.deadline(60)
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


@pytest.mark.deadline(60)
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


@pytest.mark.deadline(60)
async def test_login_stores_the_lifetime_asked_for_capped_to_the_policy_and_says_so(server):
    url, password = server["url"], server["password"] + "\n"
    asked = await ok(
        "login", url, "--username", "admin", "--password-stdin", "--lifetime", "20d", input=password
    )
    assert "capped" not in asked.stderr
    first = credentials.load().servers[url]
    assert first.expires_at - await trio.to_thread.run_sync(_now) > 20 * DAY - 60
    assert await trio.to_thread.run_sync(whoami_status, url, first.token) == (200, "")

    # Past token_max_lifetime (90 days by default) it is capped, and the login says so.
    capped = await ok(
        "login", url, "--username", "admin", "--password-stdin", "--lifetime", "400d",
        "--name", "laptop", input=password,
    )  # fmt: skip
    assert "--lifetime 400d was capped to 90d" in capped.stderr
    assert "token_max_lifetime" in capped.stderr
    assert "a new credential laptop" in capped.stdout
    second = credentials.load().servers[url]
    left = second.expires_at - await trio.to_thread.run_sync(_now)
    assert 90 * DAY - 60 < left <= 90 * DAY
    # The login it replaced is revoked; the new one works with its session gone.
    assert await trio.to_thread.run_sync(whoami_status, url, first.token) == (
        401,
        "credential_revoked",
    )
    assert await trio.to_thread.run_sync(whoami_status, url, second.token) == (200, "")
    taken = await ficc(
        "login", url, "--username", "admin", "--password-stdin", "--name", "laptop",
        input=password,
    )  # fmt: skip
    assert taken.exit_code == 1 and "[credential_name_taken]" in taken.stderr


@pytest.mark.deadline(130)
async def test_login_reads_a_piped_password_quietly_without_password_stdin(server, tmp_path):
    """Not a terminal (its own session: no controlling terminal): the password is read from
    standard input, with no warning that it may be echoed."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PYTHONUNBUFFERED": "1"}
    for name in ("FICC_URL", "FICC_TOKEN", "FICC_DATA_DIR", "FICC_CONFIG"):
        env.pop(name, None)
    with trio.fail_after(60):
        done = await trio.run_process(
            [*FICC, "login", server["url"], "--username", "admin"],
            stdin=(server["password"] + "\n").encode(),
            capture_stdout=True,
            capture_stderr=True,
            env=env,
            check=False,
            start_new_session=True,
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, (out, err)
    assert "logged in to" in out
    assert "echo" not in err.lower() and "warning" not in err.lower(), err
    # Nothing on standard input: a clear refusal naming --password-stdin, not a prompt.
    with trio.fail_after(60):
        empty = await trio.run_process(
            [*FICC, "login", server["url"], "--username", "admin"],
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            env=env,
            check=False,
            start_new_session=True,
        )
    assert empty.returncode == 2, empty.stderr
    assert "no password on standard input" in empty.stderr.decode()
    assert "--password-stdin" in empty.stderr.decode()


@pytest.mark.deadline(60)
async def test_every_credential_option_takes_a_name(server):
    url, admin, data = server["url"], server["token"], str(server["data"])
    made = await as_json(
        "admin", "create-token", "--project", "default", "--scope", "inference:invoke",
        "--name", "batch-job", "--data-dir", data,
    )  # fmt: skip
    credential_id = made["credential"]["id"]
    twice = await ficc(
        "admin", "create-token", "--project", "default", "--scope", "inference:invoke",
        "--name", "batch-job", "--data-dir", data,
    )  # fmt: skip
    assert twice.exit_code == 1 and "[credential_name_taken]" in twice.stderr
    assert "'batch-job' exists already" in twice.stderr
    # Without --name, a free default: cli, then cli-2.
    names = [
        (await as_json("admin", "create-token", "--project", "default", "--scope",
                       "models:read", "--data-dir", data))["credential"]["name"]
        for _ in range(2)
    ]  # fmt: skip
    assert names == ["cli", "cli-2"]

    limited = await as_json(
        "admin", "set-limits", "--token", "batch-job", "--rpm", "9", "--data-dir", data
    )
    assert (limited["id"], limited["limits"]["rpm"]) == (credential_id, 9)
    shown = await as_json("admin", "show-limits", "--token", "batch-job", "--data-dir", data)
    assert shown["id"] == credential_id
    used = await as_json("usage", "--key", "batch-job", "--url", url, "--token", admin)
    assert used["totals"]["requests"] == 0  # found (an unknown key is 404)
    unknown = await ficc("usage", "--key", "no-such-key", "--url", url, "--token", admin)
    assert unknown.exit_code == 1 and "[credential_not_found]" in unknown.stderr
    revoked = await as_json("admin", "revoke-token", "batch-job", "--data-dir", data)
    assert revoked["id"] == credential_id and revoked["revoked_at"] is not None
    # The name is free again once revoked.
    await as_json(
        "admin", "create-token", "--project", "default", "--scope", "inference:invoke",
        "--name", "batch-job", "--data-dir", data,
    )  # fmt: skip


@pytest.mark.deadline(60)
async def test_a_key_made_with_ficc_keys_outlives_ficc_logout_and_is_revoked_by_name(server):
    url = server["url"]
    await ok(
        "login", url, "--username", "admin", "--password-stdin", input=server["password"] + "\n"
    )
    made = await ok(
        "keys", "create", "nightly-report", "--scope", "inference:read", "--lifetime", "10d"
    )
    token = re.search(r"^token \(shown once\): (\S+)$", made.stdout, re.M).group(1)
    assert "'ficc keys revoke nightly-report" in made.stderr
    listed = {key["name"]: key for key in (await as_json("keys", "list"))["tokens"]}
    key = listed["nightly-report"]
    assert key["issuer_id"] is None and key["scopes"] == ["inference:read"]
    assert key["expires_at"] - key["created_at"] == pytest.approx(10 * DAY)
    assert re.search(
        r"^\S+\s+nightly-report\s+inference:read\s", (await ok("keys", "list")).stdout, re.M
    )
    bound = await as_json("keys", "create", "short-job", "--scope", "inference:read", "--bound")
    assert bound["credential"]["issuer_id"] == credentials.load().servers[url].credential_id

    await ok("logout")
    # The lasting key outlives the login that made it; the bound one does not.
    assert await trio.to_thread.run_sync(whoami_status, url, token) == (200, "")
    assert await trio.to_thread.run_sync(whoami_status, url, bound["token"]) == (
        401,
        "credential_revoked",
    )

    # A credential another minted (login --token mints one) makes bound keys only.
    await ok("login", url, "--token", server["token"])
    refused = await ficc("keys", "create", "other", "--scope", "inference:read")
    assert refused.exit_code == 1 and "[lasting_needs_session]" in refused.stderr
    assert "--bound" in refused.stderr
    revoked = await ok("keys", "revoke", "nightly-report")
    assert f"revoked {key['id']} (nightly-report)" in revoked.stdout
    assert await trio.to_thread.run_sync(whoami_status, url, token) == (
        401,
        "credential_revoked",
    )
