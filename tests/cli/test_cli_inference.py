"""`ficc inference ...` against a real controller with an embedded agent and llama.cpp.

The CLI is synchronous (httpx), so each invocation runs in a worker thread while the
controller keeps serving in the test's trio loop.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner, Result

from ficc_core.cli.main import cli

from ..conftest import issue_token
from ..support.inference_support import GIB, llama_spec, open_inference_controller, register_smollm2


class Cli:
    """``ficc inference --url URL --token TOKEN ...`` in a worker thread."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    async def __call__(self, *args: str, token: str | None = None) -> Result:
        runner = CliRunner()
        argv = ["inference", "--url", self.url, "--token", token or self.token, *args]
        return await trio.to_thread.run_sync(
            lambda: runner.invoke(cli, argv, env={"FICC_URL": None, "FICC_TOKEN": None})
        )

    async def ok(self, *args: str) -> Result:
        result = await self(*args)
        assert result.exit_code == 0, (args, result.stdout, result.stderr, result.exception)
        return result

    async def json(self, *args: str) -> Any:
        return json.loads((await self.ok(*args, "--json")).stdout)


def write_json(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document))
    return path


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def write_toml(path: Path, spec: dict[str, Any]) -> Path:
    """The specification as an operator writes it in TOML (flat fields, tables, arrays)."""
    lines = [
        f"{key} = {_toml_value(value)}"
        for key, value in spec.items()
        if not isinstance(value, dict | list)
    ]
    lines.append("[runtime]")
    lines += [f"{key} = {_toml_value(value)}" for key, value in spec["runtime"].items()]
    for placement in spec["placements"]:
        lines += ["[[placements]]", f"node_id = {_toml_value(placement['node_id'])}"]
        lines.append("[placements.limits]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in placement["limits"].items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _service_id(result: Result) -> str:
    match = re.search(r"\b(svc_\S+)", result.stdout)
    assert match, result.stdout
    return match.group(1)


@pytest.mark.deadline(130)
async def test_preview_create_show_tokens_stale_revision_and_remove(tmp_path):
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path) as controller:
            run = Cli(controller.url, controller.token)
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id)
            node = await controller.node()
            node_memory = node["snapshot"]["resources"]["memory_bytes"]

            # A replica asking more memory than the node has: every reason is printed.
            huge = {**spec, "placements": [{**spec["placements"][0]}]}
            huge["placements"][0]["limits"] = {"cpus": 1, "memory_bytes": node_memory + GIB}
            huge_file = write_json(tmp_path / "huge.json", huge)
            preview = await run("preview", str(huge_file))
            assert preview.exit_code == 1, preview.output
            assert "insufficient_memory" in preview.stdout
            assert re.search(r"node local has .+ of memory free; the replica asks", preview.stdout)
            assert re.search(r"^0\s+local\s+1\s+\S+ [GT]iB\s+-\s+-\s+no$", preview.stdout, re.M)
            assert "fits: no" in preview.stdout
            assert (await run("preview", str(huge_file), "--json")).exit_code == 1

            # The fitting specification, written in TOML.
            toml_file = write_toml(tmp_path / "smol.toml", spec)
            preview = await run.ok("preview", str(toml_file))
            assert re.search(r"^0\s+local\s+1\s+1 GiB\s+-\s+-\s+yes$", preview.stdout, re.M)
            assert "fits: yes" in preview.stdout
            planned = await run.json("preview", str(toml_file))
            assert planned["fits"] is True and planned["spec"]["alias"] == "smol"

            # A refused submit prints the reasons table and exits non-zero.
            refused = await run("create", str(huge_file))
            assert refused.exit_code == 1
            assert "[placement_failed]" in refused.stderr
            assert re.search(
                r"^0\s+local\s+insufficient_memory\s+node local has", refused.stderr, re.M
            )
            assert (await controller.ok("GET", "/api/v1/inference"))["services"] == []

            created = await run.ok("create", str(toml_file))
            service_id = _service_id(created)
            assert f"{service_id} stopped" in created.stdout
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["plan_digest"] == planned["plan_digest"]

            shown = await run.ok("show", service_id)
            assert re.search(r"^revision:\s+1$", shown.stdout, re.M)
            assert re.search(r"^generation:\s+0$", shown.stdout, re.M)
            assert re.search(r"^state:\s+stopped \(desired: stopped\)$", shown.stdout, re.M)
            assert re.search(
                r"^0\s+stopped\s+local\s+-\s+-\s+0\s+-\s+-\s+0\s+-$", shown.stdout, re.M
            )
            assert re.search(r"^0\s+local\s+1\s+1 GiB", shown.stdout, re.M)
            assert (await run.json("show", service_id))["revision"] == 1

            listed = await run.ok("list")
            # The model by its name; its ID only in --json.
            assert re.search(
                rf"^{service_id}\s+smol\s+smollm2\s+llama_cpp\s+stopped", listed.stdout, re.M
            )
            assert model_id not in listed.stdout
            # A reader that may not read models sees the model's ID instead.
            reader = await issue_token(controller.service, scopes={"inference:read"})
            listed = await run("list", token=reader)
            assert re.search(rf"^{service_id}\s+smol\s+{model_id}\s", listed.stdout, re.M)
            [listed_view] = (await run.json("list"))["services"]
            assert (listed_view["id"], listed_view["model_id"]) == (service_id, model_id)

            # A stale revision is refused and the current one printed; nothing changed.
            stale = await run("start", service_id, "--revision", "0")
            assert stale.exit_code == 1
            assert "[stale_revision]" in stale.stderr
            assert "current revision: 1" in stale.stderr
            assert (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["desired"] == (
                "stopped"
            )

            # Other refusals: their message and code, a non-zero exit.
            drain = await run("drain", service_id)
            assert drain.exit_code == 1 and "[invalid_transition]" in drain.stderr
            missing = await run("show", "svc_missing")
            assert missing.exit_code == 1 and "[service_not_found]" in missing.stderr
            unauthorised = await run("list", token="ficc_not-a-token")
            assert unauthorised.exit_code == 1 and "[invalid_credential]" in unauthorised.stderr
            bad_spec = write_json(tmp_path / "bad.json", {**spec, "context": 0})
            invalid = await run("create", str(bad_spec))
            assert invalid.exit_code == 1 and "[invalid_request]" in invalid.stderr
            assert "$.context" in invalid.stderr
            usage = await run("token", service_id)
            assert usage.exit_code == 2 and "exactly one of" in usage.stderr
            bad_lifetime = await run("token", service_id, "--lifetime", "soon")
            assert bad_lifetime.exit_code == 2 and "not a duration" in bad_lifetime.stderr

            # Invoke tokens: issued once, listed, revoked.
            issued = await run.ok("token", service_id, "--lifetime", "1d", "--name", "app")
            token = re.search(r"^token: (\S+)$", issued.stdout, re.M).group(1)
            credential_id = re.search(r"^credential: (\S+) \(app\)", issued.stdout, re.M).group(1)
            assert "shown only once" in issued.stderr
            models = await controller.call(
                "GET", f"/api/v1/inference/{service_id}/v1/models", token
            )
            assert models.status_code != 401, models.text  # the token authenticates
            tokens = await run.ok("token", service_id, "--list")
            assert re.search(
                rf"^{credential_id}\s+app\s+\S+ \S+\s+\S+ \S+\s+-$", tokens.stdout, re.M
            )
            [listed_token] = (await run.json("token", service_id, "--list"))["tokens"]
            assert listed_token["expires_at"] - listed_token["created_at"] == pytest.approx(86400)
            revoked = await run.ok("token", service_id, "--revoke", credential_id)
            assert f"revoked {credential_id}" in revoked.stdout
            [listed_token] = (await run.json("token", service_id, "--list"))["tokens"]
            assert listed_token["revoked_at"] is not None
            gone = await run("token", service_id, "--revoke", "cred_missing")
            assert gone.exit_code == 1 and "[credential_not_found]" in gone.stderr

            removed = await run.ok("remove", service_id, "--wait", "--interval", "0.05")
            assert f"{service_id} gone" in removed.stdout
            response = await controller.call("GET", f"/api/v1/inference/{service_id}")
            assert response.status_code == 404


@pytest.mark.deadline(190)
async def test_start_wait_ready_replace_drain_stop_and_remove(tmp_path):
    with trio.fail_after(180):
        async with open_inference_controller(tmp_path) as controller:
            run = Cli(controller.url, controller.token)
            model_id = await register_smollm2(controller)
            spec_file = write_json(tmp_path / "smol.json", await llama_spec(controller, model_id))
            service_id = _service_id(await run.ok("create", str(spec_file)))

            started = await run.ok("start", service_id, "--wait", "--interval", "0.05")
            assert "start accepted" in started.stdout
            assert f"{service_id} ready" in started.stdout
            assert "starting" in started.stderr  # the state changes it followed
            shown = await run.ok("show", service_id)
            assert re.search(r"^state:\s+ready \(desired: running\)$", shown.stdout, re.M)
            assert re.search(
                r"^0\s+ready\s+local\s+1\s+\d+\s+0\s+-\s+200\s+0\s+-$", shown.stdout, re.M
            )
            assert re.search(r"^0\s+local\s+1\s+1 GiB", shown.stdout, re.M)

            # Replace refuses a running service; stop, then replace starts generation 2.
            refused = await run("replace", service_id, str(spec_file))
            assert refused.exit_code == 1 and "[invalid_transition]" in refused.stderr
            stopped = await run.ok("stop", service_id, "--wait", "--interval", "0.05")
            assert f"{service_id} stopped" in stopped.stdout
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["replicas"][0]["state"] == "stopped"
            assert view["replicas"][0]["reservation"] is None

            bigger = write_json(
                tmp_path / "bigger.json",
                {**json.loads(spec_file.read_text()), "context": 1024},
            )
            replaced = await run.ok(
                "replace", service_id, str(bigger), "--wait", "--interval", "0.05"
            )
            assert f"{service_id} ready" in replaced.stdout
            view = await run.json("show", service_id)
            assert (view["generation"], view["spec"]["context"]) == (2, 1024)

            drained = await run.ok("drain", service_id, "--wait", "--interval", "0.05")
            assert f"{service_id} stopped" in drained.stdout
            removed = await run.ok("remove", service_id, "--wait", "--interval", "0.05")
            assert f"{service_id} gone" in removed.stdout
            assert (await run.json("list"))["services"] == []


@pytest.mark.deadline(130)
async def test_wait_times_out_with_the_state_it_saw(tmp_path):
    """--wait gives up after --timeout, naming the state; the request itself was accepted."""
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path) as controller:
            run = Cli(controller.url, controller.token)
            model_id = await register_smollm2(controller)
            spec_file = write_json(tmp_path / "smol.json", await llama_spec(controller, model_id))
            service_id = _service_id(await run.ok("create", str(spec_file)))
            result = await run("start", service_id, "--wait", "--timeout", "10ms")
            assert result.exit_code == 1
            assert "timed out after 0.01 s" in result.stderr
            assert "start accepted" in result.stdout
            bad = await run("stop", service_id, "--timeout", "later")
            assert bad.exit_code == 2
            await run.ok("stop", service_id, "--wait", "--interval", "0.05")


async def _record_unknown_attempt(controller, service_id: str, node_id: str) -> str:
    """Record what a lost node leaves behind: an unreleased replica attempt in ``unknown``.

    (tests/inference/test_inference_faults.py produces one for real by killing a remote executor;
    here the record alone is enough to drive the CLI's refusal and acknowledgement.)
    """
    from ficc_core.inference import repository
    from ficc_core.inference.records import AttemptRecord, AttemptState

    attempt_id = f"{service_id}.r0.g0.a1.lost"
    now = controller.service.inference.clock()
    lost = AttemptRecord(
        attempt_id=attempt_id,
        service_id=service_id,
        replica=0,
        generation=0,
        number=1,
        node_id=node_id,
        provider="process",
        plan_digest="sha256:" + "1" * 64,
        state=AttemptState.UNKNOWN,
        reason="node_lost",
        created_at=now,
        updated_at=now,
    )

    def write(tx) -> None:
        repository.insert_attempt(tx, lost)
        repository.bump(tx, service_id, now)

    await controller.service.store.write(write)
    return attempt_id


@pytest.mark.deadline(130)
async def test_start_refuses_an_unknown_outcome_until_acknowledged(tmp_path):
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path) as controller:
            run = Cli(controller.url, controller.token)
            model_id = await register_smollm2(controller)
            spec_file = write_json(tmp_path / "smol.json", await llama_spec(controller, model_id))
            service_id = _service_id(await run.ok("create", str(spec_file)))
            # A node that is registered but not connected keeps the attempt's fate unknown.
            await controller.service.contributors.add_node("gone-1")
            lost = await _record_unknown_attempt(controller, service_id, "gone-1")

            shown = await run.ok("show", service_id)
            assert re.search(rf"^unknown:\s+{re.escape(lost)} ", shown.stdout, re.M)
            assert re.search(
                r"^0\s+unknown\s+gone-1 \(registered\)\s+1\s+-\s+0\s+-\s+-\s+0\s+node_lost$",
                shown.stdout,
                re.M,
            )

            refused = await run("start", service_id)
            assert refused.exit_code == 1
            assert "[inference_unknown_outcome]" in refused.stderr
            assert f"replica 0 attempt {lost} on node gone-1" in refused.stderr
            assert "--acknowledge-unknown" in refused.stderr
            assert (await run.json("show", service_id))["desired"] == "stopped"

            started = await run.ok(
                "start", service_id, "--acknowledge-unknown", "--wait", "--interval", "0.05"
            )
            assert f"{service_id} ready" in started.stdout
            view = await run.json("show", service_id)
            assert view["unknown_attempts"] == []
            assert view["replicas"][0]["attempt_id"] != lost
            await run.ok("stop", service_id, "--wait", "--interval", "0.05")


def test_unreadable_specifications_a_missing_token_and_no_controller(tmp_path):
    """Refused before (or without) any answer from a controller: clear message, non-zero exit."""
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(cli, ["inference", *args], env={"FICC_URL": None, "FICC_TOKEN": None})

    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    result = invoke("--token", "t", "preview", str(broken))
    assert result.exit_code == 2 and "not valid JSON" in result.stderr
    broken_toml = tmp_path / "broken.toml"
    broken_toml.write_text("alias = \n")
    result = invoke("--token", "t", "create", str(broken_toml))
    assert result.exit_code == 2 and "not valid TOML" in result.stderr
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    result = invoke("--token", "t", "preview", str(listed))
    assert result.exit_code == 2 and "one specification object" in result.stderr
    result = invoke("--token", "t", "preview", str(tmp_path / "missing.json"))
    assert result.exit_code == 2 and "cannot read" in result.stderr

    result = invoke("list")
    assert result.exit_code == 2 and "FICC_TOKEN" in result.stderr

    # Port 9 on loopback (discard) is closed here: the connection is refused.
    result = invoke("--url", "http://127.0.0.1:9", "--token", "t", "list")
    assert result.exit_code == 1 and "cannot reach http://127.0.0.1:9" in result.stderr
