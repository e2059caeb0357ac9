"""Names and aliases for IDs, and `ficc inference chat`, against a real controller.

The service is the stand-in engine behind the vllm adapter on the embedded node
(tests/inference/test_inference_directory_models.py), so a chat streams in milliseconds; the
real llama.cpp engine end to end is the quick start's test.
"""

from __future__ import annotations

import json

import pytest
import trio
from click.testing import CliRunner

from ficc_core.cli.main import cli

from ..inference.test_inference_directory_models import register_tiny_hf, vllm_spec, write_fake_vllm
from ..support.inference_support import open_inference_controller
from .test_cli_inference import Cli


@pytest.mark.deadline(130)
async def test_names_and_aliases_resolve_and_chat_streams_an_answer(tmp_path):
    engine, settings, files = write_fake_vllm(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            run = Cli(controller.url, controller.token)
            model = await register_tiny_hf(controller, files)
            spec = await vllm_spec(controller, model["id"], engine, alias="tiny")
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            ids = {"tiny": created["id"]}
            spec_file = tmp_path / "other.json"
            spec_file.write_text(
                json.dumps(await vllm_spec(controller, model["id"], engine, alias="other"))
            )
            created = await run.ok("create", str(spec_file))
            ids["other"] = created.stdout.split()[0]
            # The hint names the controller in use (not the default one).
            assert f"start it with: ficc inference start other --url {controller.url}" in (
                created.stdout
            )

            # A model by its name, a service by its alias or the start of its ID.
            runner = CliRunner()
            shown = await trio.to_thread.run_sync(
                lambda: runner.invoke(
                    cli,
                    ["models", "show", "tiny-hf", "--url", controller.url, "--json"],
                    env={"FICC_TOKEN": controller.token, "FICC_URL": None},
                )
            )
            assert shown.exit_code == 0, shown.output
            assert json.loads(shown.stdout)["id"] == model["id"]
            assert (await run.json("show", "tiny"))["id"] == ids["tiny"]
            assert (await run.json("show", ids["other"][:12]))["id"] == ids["other"]
            ambiguous = await run("show", "svc_")
            assert ambiguous.exit_code == 1
            assert "[ambiguous_name]" in ambiguous.stderr
            assert ids["tiny"] in ambiguous.stderr and ids["other"] in ambiguous.stderr
            missing = await run("show", "nothing-like-it")
            assert missing.exit_code == 1 and "[service_not_found]" in missing.stderr

            started = await run.ok("start", "tiny", "--wait", "--interval", "0.05")
            assert f"{ids['tiny']} ready" in started.stdout
            rested = await run.json("stop", "other", "--wait", "--interval", "0.05")
            assert (rested["id"], rested["state"]) == (ids["other"], "stopped")

            # One question: the stand-in's deltas, streamed, then a newline.
            answered = await run.ok("chat", "tiny", "--message", "hello there")
            assert answered.stdout == "w0 w1 w2 w3 w4 w5 w6 w7 \n"
            document = await run.json("chat", "tiny", "-m", "hello")
            assert document == {
                "role": "assistant",
                "content": "w0 w1 w2 w3 w4 w5 w6 w7 ",
                "finish_reason": "stop",
            }
            # Without --message each line of standard input is a turn, until its end.
            runner = CliRunner()
            argv = ["inference", "chat", "tiny", "--url", controller.url, "--json"]
            turns = await trio.to_thread.run_sync(
                lambda: runner.invoke(
                    cli, argv, input="one\n\ntwo\n", env={"FICC_TOKEN": controller.token}
                )
            )
            assert turns.exit_code == 0, turns.output
            assert [json.loads(line)["finish_reason"] for line in _documents(turns.stdout)] == [
                "stop",
                "stop",
            ]
            # A credential that may not invoke: the gateway's refusal and what to do.
            reader = (
                await controller.ok(
                    "POST",
                    "/api/v1/tokens",
                    status=201,
                    json={"name": "reader", "scopes": ["inference:read"]},
                )
            )["token"]
            refused = await run("chat", "tiny", "-m", "hi", token=reader)
            assert refused.exit_code == 1 and "[missing_scope]" in refused.stderr
            assert f"ficc inference token {ids['tiny']} --lifetime 1h" in refused.stderr
            await run.ok("stop", "tiny", "--wait", "--interval", "0.05")


def _documents(text: str) -> list[str]:
    """The indented JSON documents printed one after another, each as one line."""
    decoder, found, index = json.JSONDecoder(), [], 0
    while index < len(text):
        if text[index].isspace():
            index += 1
            continue
        document, index = decoder.raw_decode(text, index)
        found.append(json.dumps(document))
    return found
