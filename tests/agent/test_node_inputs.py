"""A node credential downloads only the inputs of the attempts assigned to its node, while
they are assigned: never another project's files, nor an attempt's once it is stopped."""

from __future__ import annotations

import httpx
import pytest
import trio

from ficc_core.agent.remote import RemoteAgent
from ficc_core.schema import JobInput
from ficc_core.testing.executor_kit import new_fence, standin_job

from ..conftest import bearer, issue_token
from ..support.agent_support import open_controller, wait_connected
from ..support.models_support import random_bytes
from .test_staging import _verified_model, staging_agents

MiB = 1 << 20


async def _fetch(url: str, token: str, digest: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await client.get(f"/api/v1/contributors/blobs/{digest}", headers=bearer(token))


async def _refused(url: str, token: str, digest: str) -> None:
    answer = await _fetch(url, token, digest)
    assert answer.status_code == 404, (digest, answer.status_code)
    # The same refusal as for a digest nobody has: nothing about whose file it is.
    assert answer.json()["error"]["code"] == "blob_unknown"
    assert answer.json()["error"]["details"] == {}


@pytest.mark.deadline(70)
async def test_a_node_fetches_exactly_its_assigned_inputs_and_loses_them_when_stopped(tmp_path):
    from ficc_executor_process.testing import running_process_provider, short_state_dir

    with trio.fail_after(60):
        async with open_controller(tmp_path) as (service, url):
            admin = (await service.auth.bootstrap())["token"]
            await service.auth.create_project("other")
            stranger = await issue_token(service, project="other", name="theirs")
            content = random_bytes(MiB + 7, seed=21)
            mine = await _verified_model(url, admin, content, name="mine")
            spare = await _verified_model(url, admin, random_bytes(99, seed=22), name="spare")
            theirs = await _verified_model(url, stranger, random_bytes(77, seed=23), name="x")
            _, idle = await service.contributors.add_node("idle")  # never connects
            _, node = await service.contributors.add_node("gpu-1")
            everything = (mine, spare, theirs, "0" * 64)

            # No attempt is assigned yet: every digest is refused alike, to both nodes.
            for token in (idle, node):
                for digest in everything:
                    await _refused(url, token, digest)

            with short_state_dir("fn-") as agent_dir:
                async with running_process_provider(agent_dir / "p") as provider:
                    make = staging_agents(provider, agent_dir, url, node)
                    async with trio.open_nursery() as nursery:
                        await nursery.start(RemoteAgent(url, node, make).run)
                        await wait_connected(service, "gpu-1")
                        job = standin_job(
                            inputs=(
                                JobInput(id="model", path="/not/here", digest=f"sha256:{mine}"),
                            )
                        )
                        fence = new_fence()
                        # The agent stages the input over the blob route during the launch.
                        await service.contributors.launch(
                            "gpu-1", "process", job, fence, blobs={f"sha256:{mine}": len(content)}
                        )
                        staged = agent_dir / "blobs" / "sha256" / mine
                        assert staged.read_bytes() == content
                        assert (await _fetch(url, node, mine)).content == content
                        for digest in (spare, theirs):
                            await _refused(url, node, digest)
                        await _refused(url, idle, mine)

                        await service.contributors.stop("gpu-1", fence, grace=1.0)
                        await _refused(url, node, mine)

                        # Given up: the controller records it no longer wants the attempt.
                        again = new_fence()
                        await service.contributors.launch(
                            "gpu-1", "process", job, again, blobs={f"sha256:{mine}": len(content)}
                        )
                        assert (await _fetch(url, node, mine)).status_code == 200
                        await service.contributors.give_up("gpu-1", again.attempt_id)
                        await _refused(url, node, mine)
                        await service.contributors.stop("gpu-1", again, grace=1.0)
                        nursery.cancel_scope.cancel()
