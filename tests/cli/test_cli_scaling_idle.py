"""``ficc inference start|show|pin|unpin`` on an on-demand service (``min = 0``) against a
real controller with an embedded agent and llama.cpp (SmolLM2): it rests idle, show says
why and that the next request wakes it, pin wakes it and keeps it, unpin lets it go idle
again, and a request wakes it."""

from __future__ import annotations

import re

import pytest
import trio

from ..support.inference_support import llama_spec, open_inference_controller, register_smollm2
from .test_cli_inference import Cli, _service_id, write_json

IDLE_LINE = re.compile(r"^idle:\s+.+the next request wakes it$", re.M)


@pytest.mark.deadline(100)
async def test_an_on_demand_service_rests_idle_and_pin_wakes_it_until_unpinned(tmp_path):
    with trio.fail_after(90):
        async with open_inference_controller(tmp_path, scale_cooldown=0) as controller:
            run = Cli(controller.url, controller.token)
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id, memory_bytes=512 << 20)
            spec_file = write_json(tmp_path / "smol.json", spec)
            created = await run.ok("create", str(spec_file), "--min", "0", "--idle-timeout", "10s")
            service_id = _service_id(created)

            # start --wait ends once it rests idle: nothing runs until a request comes.
            started = await run.ok("start", "smol", "--wait", "--interval", "0.05")
            assert f"{service_id} idle" in started.stdout, started.output
            shown = await run.ok("show", "smol")
            assert re.search(
                r"^scaling:\s+0 of at most 1 replica running \(min 0, idle timeout 10s\)$",
                shown.stdout,
                re.M,
            ), shown.stdout
            assert IDLE_LINE.search(shown.stdout), shown.stdout
            assert re.search(r"^state:\s+idle \(desired: running\)$", shown.stdout, re.M)
            assert not re.search(r"^reason:", shown.stdout, re.M)  # said once, on the idle line
            listed = await run.ok("list")
            assert re.search(rf"^{service_id}\s.*\sidle\s.*\s0/1 min 0$", listed.stdout, re.M)

            # Pinning wakes it; --wait follows it until its replica is ready.
            pinned = await run.ok("pin", "smol", "--wait", "--interval", "0.05")
            assert "pinned; state ready" in pinned.stdout, pinned.output
            assert re.search(
                r"^scaling:\s+1 of at most 1 replica running \(min 0, idle timeout 10s\), pinned$",
                pinned.stdout,
                re.M,
            ), pinned.stdout
            assert (await run.json("show", "smol"))["scaling"]["pinned"] is True

            unpinned = await run.ok("unpin", "smol")
            assert "unpinned; state" in unpinned.stdout, unpinned.output
            assert not re.search(r"^scaling:.*pinned$", unpinned.stdout, re.M), unpinned.stdout
            assert (await run.json("show", "smol"))["scaling"]["pinned"] is False
            # Unpinned, nobody asking, it goes idle again after its idle timeout (10 s, the
            # least a specification may name), and its reservation goes once the executor
            # confirms the replica's end.
            await controller.wait_service(
                service_id,
                lambda v: v["state"] == "idle" and v["replicas"][0]["reservation"] is None,
            )
            shown = await run.ok("show", "smol")
            assert IDLE_LINE.search(shown.stdout), shown.stdout
            assert re.search(r"^scaling:\s+0 of at most 1 replica running", shown.stdout, re.M)
            assert re.search(r"^0\s+local\s+not held\s+-\s+-$", shown.stdout, re.M)

            # A request wakes it: show says it runs again, and no longer that it is idle.
            issued = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 600}
            )
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            response = await controller.call(
                "POST",
                f"/api/v1/inference/{service_id}/v1/chat/completions",
                issued["token"],
                json=chat,
            )
            assert response.status_code == 200, response.text
            shown = await run.ok("show", "smol")
            assert re.search(r"^state:\s+ready \(desired: running\)$", shown.stdout, re.M)
            assert re.search(
                r"^scaling:\s+1 of at most 1 replica running \(min 0, idle timeout 10s\)$",
                shown.stdout,
                re.M,
            ), shown.stdout
            assert re.search(r"^active:\s+placement 0$", shown.stdout, re.M)
            assert not IDLE_LINE.search(shown.stdout)

            # A stale revision is the controller's refusal, with the current one.
            stale = await run("pin", "smol", "--revision", "0")
            assert stale.exit_code == 1 and "[stale_revision]" in stale.stderr
