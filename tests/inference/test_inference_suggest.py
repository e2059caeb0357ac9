"""Suggested specifications, model names in a specification, giving up, `inference create`.

Against a real controller with an embedded agent that has the llama.cpp runtime
(tests/support/inference_support.py); the model is the real SmolLM2 GGUF.
"""

from __future__ import annotations

import json
import time

import pytest
import trio
from click.testing import CliRunner

from ficc_core.cli.main import cli

from ..support.inference_support import (
    broken_engine,
    llama_server_executable,
    llama_spec,
    open_inference_controller,
    register_gguf,
    register_smollm2,
)
from ..support.models_support import smollm2_path

MIB = 1024**2
#: SmolLM2-135M's header: 30 layers, 3 KV heads of 64 (576 / 9 heads); f16 K and V.
SMOLLM2_KV_PER_TOKEN = 30 * 3 * (64 + 64) * 2
LLAMA_CPP_OVERHEAD = 64 * MIB


def _estimate(context: int, concurrency: int) -> int:
    size = smollm2_path().stat().st_size
    return size + SMOLLM2_KV_PER_TOKEN * context * concurrency + LLAMA_CPP_OVERHEAD


def _partial(model: str, **changes) -> dict:
    return {
        "alias": "smol",
        "model_id": model,
        "engine": "llama_cpp",
        "context": 2048,
        "concurrency": 4,
        **changes,
    }


@pytest.mark.deadline(70)
async def test_a_partial_specification_previews_as_the_complete_one_submit_accepts(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            node = await controller.node("local")
            [runtime] = node["snapshot"]["runtimes"]
            # The model by its name; no runtime, executable or placement.
            preview = await controller.ok(
                "POST", "/api/v1/inference/preview", json=_partial("smollm2")
            )
            assert preview["fits"] is True
            assert preview["suggested"] == [
                "$.placements",
                "$.placements[0].node_id",
                "$.placements[0].limits",
                "$.runtime",
                "$.image_executable",
            ]
            assert "warnings" not in preview
            spec = preview["spec"]
            assert spec["model_id"] == model_id
            assert spec["runtime"] == {
                "executor_provider": "process",
                "package_digest": runtime["package_digest"],
                "image_digest": runtime["image_digest"],
                "isolation": "process",
                "network": "none",
            }
            assert spec["image_executable"] == str(llama_server_executable())
            # At most half the node's CPUs: the next generation of a rollout fits beside.
            half = node["snapshot"]["resources"]["cpus"] / 2
            cpus = float(min(4, int(half))) if half >= 1 else int(half * 4) / 4
            assert spec["placements"] == [
                {
                    "node_id": "local",
                    "limits": {"cpus": cpus, "memory_bytes": _estimate(2048, 4), "gpus": []},
                }
            ]
            # Two replicas without nodes or limits: each is filled, the node has room.
            two = await controller.ok(
                "POST", "/api/v1/inference/preview", json=_partial(model_id, placements=[{}, {}])
            )
            assert [p["node_id"] for p in two["spec"]["placements"]] == ["local", "local"]
            assert "$.placements[1].limits" in two["suggested"]
            # They share the node's free CPUs.
            shares = [p["limits"]["cpus"] for p in two["spec"]["placements"]]
            assert shares[0] == shares[1] and sum(shares) <= node["snapshot"]["resources"]["cpus"]
            assert two["fits"] is True

            # A runtime given: the executable is that runtime's, and only it is suggested.
            given = await controller.ok(
                "POST",
                "/api/v1/inference/preview",
                json=_partial(model_id, runtime=spec["runtime"], placements=spec["placements"]),
            )
            assert given["suggested"] == ["$.image_executable"]
            assert given["spec"] == spec

            # The completed specification is what submit takes, unchanged; it is stored.
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            assert created["spec"] == spec
            assert created["model_id"] == model_id

            # A complete specification previews as before: no suggested, no warnings.
            again = await controller.ok("POST", "/api/v1/inference/preview", json=spec)
            assert "suggested" not in again and "warnings" not in again


@pytest.mark.deadline(70)
async def test_what_cannot_be_suggested_is_refused_at_the_path_to_give(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path, embedded=False) as controller:
            await register_smollm2(controller)
            response = await controller.call(
                "POST", "/api/v1/inference/preview", json=_partial("smollm2")
            )
            assert response.status_code == 400, response.text
            [error] = response.json()["error"]["details"]["errors"]
            assert error["path"] == "$.placements[0].node_id"
            assert "no connected node has a runtime for the llama_cpp engine" in error["message"]
            response = await controller.call(
                "POST", "/api/v1/inference/preview", json=_partial("smollm2", placements=[])
            )
            assert response.status_code == 400
            paths = [e["path"] for e in response.json()["error"]["details"]["errors"]]
            assert paths == ["$.runtime", "$.image_executable"]  # no node to ask
            # Submit never completes a specification: it is the contract's, complete.
            response = await controller.call("POST", "/api/v1/inference", json=_partial("smollm2"))
            assert response.status_code == 400
            paths = [e["path"] for e in response.json()["error"]["details"]["errors"]]
            assert "$.runtime" in paths


@pytest.mark.deadline(70)
async def test_a_bad_context_or_concurrency_is_refused_at_its_own_path(tmp_path):
    # The limits are suggested from both: a bad one used to be reported as the limits it
    # left missing ($.placements[0].limits), at the wrong field of a form.
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path) as controller:
            await register_smollm2(controller)
            bad = [
                ({"context": 0}, "$.context", "must be from 1 to 16777216, got 0"),
                ({"concurrency": -1}, "$.concurrency", "must be from 1 to"),
                ({"context": "4096"}, "$.context", "must be an integer, got string"),
                ({"prompt_cache_bytes": -1}, "$.prompt_cache_bytes", "must be from 0 to"),
            ]
            for changes, path, message in bad:
                response = await controller.call(
                    "POST", "/api/v1/inference/preview", json=_partial("smollm2", **changes)
                )
                assert response.status_code == 400, response.text
                [error] = response.json()["error"]["details"]["errors"]
                assert error["path"] == path and message in error["message"], error
            good = await controller.call(
                "POST", "/api/v1/inference/preview", json=_partial("smollm2")
            )
            assert good.status_code == 200, good.text


@pytest.mark.deadline(70)
async def test_a_memory_limit_below_the_estimate_is_a_preview_warning_with_it(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(
                controller, model_id, memory_bytes=64 * MIB, context=2048, concurrency=4
            )
            preview = await controller.ok("POST", "/api/v1/inference/preview", json=spec)
            assert preview["fits"] is True  # it fits the node; the engine would not fit it
            [warning] = preview["warnings"]
            assert warning["code"] == "memory_limit_low"
            assert warning["details"] == {
                "estimate_bytes": _estimate(2048, 4),
                "limit_bytes": 64 * MIB,
                "path": "$.placements[0].limits.memory_bytes",
            }
            assert f"{_estimate(2048, 4) / MIB:,.0f} MiB" in warning["message"]
            assert "suggested" not in preview
            # A host prompt cache the engine is given is memory it needs too.
            cached = {**spec, "prompt_cache_bytes": 512 * MIB}
            preview = await controller.ok("POST", "/api/v1/inference/preview", json=cached)
            [warning] = preview["warnings"]
            assert warning["details"]["estimate_bytes"] == _estimate(2048, 4) + 512 * MIB
            partial = _partial("smollm2", prompt_cache_bytes=512 * MIB)
            suggested = await controller.ok("POST", "/api/v1/inference/preview", json=partial)
            limits = suggested["spec"]["placements"][0]["limits"]
            assert limits["memory_bytes"] >= _estimate(2048, 4) + 512 * MIB
            assert "warnings" not in suggested


@pytest.mark.deadline(70)
async def test_a_verified_model_whose_gguf_header_cannot_be_read_is_said_so(tmp_path):
    # Its bytes are the ones its manifest names (verified), but they are no GGUF any
    # engine reads: the model's view and a service's preview say why.
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"GGUF" + bytes(100))
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_gguf(controller, bogus, "bogus")
            model = await controller.ok("GET", f"/api/v1/models/{model_id}")
            assert model["state"] == "verified" and model["metadata"] is None
            assert model["metadata_error"].startswith("unsupported GGUF version 0")
            spec = await llama_spec(controller, model_id, memory_bytes=256 * MIB)
            preview = await controller.ok("POST", "/api/v1/inference/preview", json=spec)
            [warning] = preview["warnings"]
            assert warning["code"] == "model_header_unreadable"
            assert warning["details"]["path"] == "$.model_id"
            assert "unsupported GGUF version 0" in warning["details"]["problem"]
            # A readable model says nothing of the kind.
            good = await controller.ok(
                "GET", f"/api/v1/models/{await register_smollm2(controller)}"
            )
            assert good["metadata"] is not None and good["metadata_error"] is None


@pytest.mark.deadline(70)
async def test_a_model_name_in_model_id_resolves_and_the_id_is_stored(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller, name="smollm2")
            spec = await llama_spec(controller, "smollm2")
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            assert created["model_id"] == model_id
            assert created["spec"]["model_id"] == model_id
            stored = await controller.service.store.read(
                lambda tx: tx.fetch_one(
                    "SELECT model_id, spec FROM inference_services WHERE id = ?",
                    (created["id"],),
                )
            )
            assert stored["model_id"] == model_id
            assert json.loads(stored["spec"])["model_id"] == model_id


@pytest.mark.deadline(70)
async def test_an_ambiguous_model_name_is_refused_listing_the_candidates(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path) as controller:
            # A name that is another model's ID is refused: model_id could not tell them apart.
            first = await register_smollm2(controller, name="smollm2")
            copy = tmp_path / "copy.gguf"
            copy.write_bytes(smollm2_path().read_bytes() + b"\0" * 32)
            manifest = {
                "name": first,
                "format": "gguf",
                "files": [{"path": "copy.gguf", "size": 1, "sha256": "0" * 64}],
            }
            refused = await controller.call("POST", "/api/v1/models", json=manifest)
            assert refused.status_code == 409, refused.text
            error = refused.json()["error"]
            assert error["code"] == "model_name_taken"
            assert error["details"] == {"id": first, "path": "$.name"}
            # A database from before that check may hold such a pair: refused with a way out.
            second = await register_gguf(controller, copy, "copy")
            await controller.service.store.write(
                lambda tx: tx.execute("UPDATE models SET name = ? WHERE id = ?", (first, second))
            )
            spec = await llama_spec(controller, first)
            for route in ("/api/v1/inference/preview", "/api/v1/inference"):
                response = await controller.call("POST", route, json=spec)
                assert response.status_code == 409, response.text
                error = response.json()["error"]
                assert error["code"] == "model_ambiguous"
                assert error["details"]["candidates"] == sorted([first, second])
                assert first in error["message"] and second in error["message"]
                assert f"delete model {second}" in error["message"]
            assert (await controller.ok("GET", "/api/v1/inference"))["services"] == []


def _cli(url: str, token: str, *args: str):
    argv = ["inference", "--url", url, "--token", token, *args]
    return CliRunner().invoke(cli, argv, env={"FICC_URL": None, "FICC_TOKEN": None})


@pytest.mark.deadline(100)
async def test_inference_create_shows_the_suggestion_and_submits_it(tmp_path):
    with trio.fail_after(90):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            url, token = controller.url, controller.token
            shown = await trio.to_thread.run_sync(
                lambda: _cli(
                    url, token, "create", "--model", "smollm2", "--engine", "llama_cpp", "--json"
                )
            )
            assert shown.exit_code == 0, shown.output
            document = json.loads(shown.stdout)
            assert document["preview"]["spec"]["model_id"] == model_id
            assert "service" not in document  # --json without --yes submits nothing
            assert (await controller.ok("GET", "/api/v1/inference"))["services"] == []

            made = await trio.to_thread.run_sync(
                lambda: _cli(
                    url,
                    token,
                    "create",
                    "--model",
                    "smollm2",
                    "--engine",
                    "llama_cpp",
                    "--no-start",
                    "--yes",
                )
            )
            assert made.exit_code == 0, made.output
            assert "suggested:" in made.stdout and "fits: yes" in made.stdout
            [service] = (await controller.ok("GET", "/api/v1/inference"))["services"]
            assert service["alias"] == "smollm2"
            assert service["spec"] == document["preview"]["spec"] | {"alias": "smollm2"}
            assert service["desired"] == "stopped"
            # A stopped service holds its reservations: remove it to make room again.
            assert (await controller.control(service["id"], "remove")).status_code == 200
            while (await controller.ok("GET", "/api/v1/inference"))["services"]:  # noqa: ASYNC110
                await trio.sleep(0.05)

            scripted = await trio.to_thread.run_sync(
                lambda: _cli(
                    url,
                    token,
                    "create",
                    "--model",
                    model_id,
                    "--engine",
                    "llama_cpp",
                    "--alias",
                    "smol-2",
                    "--no-start",
                    "--yes",
                    "--json",
                )
            )
            assert scripted.exit_code == 0, scripted.output
            document = json.loads(scripted.stdout)
            assert document["service"]["alias"] == "smol-2"
            assert document["service"]["spec"] == document["preview"]["spec"]


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_inference_create_start_wait_json_prints_the_ready_service_once(tmp_path):
    """``create --yes --wait --json`` waits for the start and prints one document."""
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path) as controller:
            await register_smollm2(controller)
            url, token = controller.url, controller.token
            made = await trio.to_thread.run_sync(
                lambda: _cli(
                    url,
                    token,
                    "create",
                    "--model",
                    "smollm2",
                    "--engine",
                    "llama_cpp",
                    "--yes",
                    "--wait",
                    "--timeout",
                    "90s",
                    "--json",
                )
            )
            assert made.exit_code == 0, made.output
            document = json.loads(made.stdout)
            assert document["service"]["state"] == "ready"
            assert document["service"]["desired"] == "running"
            assert (
                document["preview"]["spec"]["model_id"] == document["service"]["spec"]["model_id"]
            )


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_a_replica_failing_the_same_way_stops_retrying_and_start_wait_ends_with_why(tmp_path):
    engine, settings = broken_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), replica_retry_max="1s", replica_give_up_after=3
        ) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id)
            spec["image_executable"] = str(engine)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            url, token = controller.url, controller.token
            began = time.monotonic()
            waited = await trio.to_thread.run_sync(
                lambda: _cli(url, token, "start", service_id, "--wait", "--timeout", "90s")
            )
            took = time.monotonic() - began
            assert waited.exit_code != 0, waited.output
            assert "stopped retrying" in waited.output and "(exited)" in waited.output
            assert took < 60
            view = await controller.wait_service(service_id, lambda v: v["state"] == "failed")
            assert view["stopped_retrying"] == [0]
            assert "its last 3 attempts failed the same way (exited)" in view["reason"]
            assert view["replicas"][0]["attempt"] == 3
            # It stays given up: no fourth attempt comes after the backoff.
            with trio.move_on_after(2.5):
                await controller.wait_service(
                    service_id, lambda v: v["replicas"][0]["attempt"] > 3, period=0.1
                )
            assert (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["replicas"][0][
                "attempt"
            ] == 3


@pytest.mark.slow
@pytest.mark.deadline(160)
async def test_a_too_small_memory_limit_warns_then_the_real_engine_stops_retrying(tmp_path):
    with trio.fail_after(150):
        async with open_inference_controller(
            tmp_path, replica_retry_max="1s", replica_give_up_after=3
        ) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(
                controller, model_id, memory_bytes=48 * MIB, context=2048, concurrency=4
            )
            preview = await controller.ok("POST", "/api/v1/inference/preview", json=spec)
            assert preview["fits"] is True
            assert preview["warnings"][0]["details"]["estimate_bytes"] == _estimate(2048, 4)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            url, token = controller.url, controller.token
            waited = await trio.to_thread.run_sync(
                lambda: _cli(url, token, "start", service_id, "--wait", "--timeout", "120s")
            )
            assert waited.exit_code != 0, waited.output
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["stopped_retrying"] == [0]
            reason = view["replicas"][0]["reason"]
            assert f"failed the same way ({reason})" in view["reason"]
            assert view["reason"] in waited.output
            labels = (await controller.node("local"))["snapshot"]["labels"]
            if labels["limits.memory"].startswith("cgroup"):
                # The kernel killed it at its limit, and the executor says so.
                assert reason == "memory_limit", view
            # The replica's status shows the last exit and the restarts that led there.
            status = await controller.ok("GET", f"/api/v1/inference/{service_id}/status")
            (replica,) = status["replicas"]
            assert replica["restarts"] == 2 and replica["last_exit"]["attempt"] == 3
            assert replica["last_exit"]["reason"] == reason
            assert replica["last_exit"]["memory_limit"] is (reason == "memory_limit")
            if replica["last_exit"]["memory_limit"]:
                assert replica["last_exit"]["signal"] == 9
