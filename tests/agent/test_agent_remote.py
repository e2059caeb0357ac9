"""Remote agents dial out over a WebSocket: node credentials, heartbeats, fencing, leases."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from ficc_core.agent.remote import AgentRefused, RemoteAgent, websocket_url

from ..conftest import issue_token
from ..support.agent_support import (
    controller_missed,
    heartbeats,
    lease_carried,
    process_agent_maker,
    wait_connected,
)
from ..support.agent_support import open_controller as _controller
from ..support.waiting import eventually


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_controller_urls_become_websocket_urls():
    assert (
        websocket_url("http://127.0.0.1:8484") == "ws://127.0.0.1:8484/api/v1/contributors/connect"
    )
    assert (
        websocket_url("https://ficc.example/") == "wss://ficc.example/api/v1/contributors/connect"
    )
    with pytest.raises(AgentRefused):
        websocket_url("ftp://x")


@pytest.mark.deadline(40)
async def test_a_remote_agent_connects_and_the_controller_lists_its_measured_resources(
    tmp_path, agent_dir
):
    with trio.fail_after(30):
        async with _controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            remote = RemoteAgent(url, token, process_agent_maker(agent_dir))
            async with trio.open_nursery() as nursery:
                agent = await nursery.start(remote.run)
                assert agent.node_id == "gpu-1"
                while (await service.contributors.get("gpu-1")).snapshot is None:  # noqa: ASYNC110
                    await trio.sleep(0.05)
                node = await service.contributors.get("gpu-1")
                assert node.state == "connected"
                assert node.snapshot["resources"]["cpus"] >= 1
                assert node.snapshot["endpoint_version"] == 1
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_a_project_credential_cannot_connect_as_a_node(tmp_path, agent_dir):
    with trio.fail_after(30):
        async with _controller(tmp_path) as (service, url):
            await service.auth.bootstrap()
            token = await issue_token(service)
            with pytest.raises(AgentRefused) as refused:
                await RemoteAgent(url, token, process_agent_maker(agent_dir)).run()
            assert refused.value.code == "credential_refused"


@pytest.mark.deadline(40)
async def test_a_node_credential_cannot_report_as_another_node(tmp_path, agent_dir):
    with trio.fail_after(30):
        async with _controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            await service.contributors.add_node("gpu-2")
            remote = RemoteAgent(url, token, process_agent_maker(agent_dir, node_id="gpu-2"))
            with pytest.raises(AgentRefused) as refused:
                await remote.run()
            assert refused.value.code == "node_mismatch"
            assert (await service.contributors.get("gpu-2")).snapshot is None


@pytest.mark.deadline(40)
async def test_a_revoked_node_credential_is_refused(tmp_path, agent_dir):
    with trio.fail_after(30):
        async with _controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            await service.contributors.revoke_node("gpu-1")
            with pytest.raises(AgentRefused) as refused:
                await RemoteAgent(url, token, process_agent_maker(agent_dir)).run()
            assert refused.value.code == "credential_refused"
            assert "revoked" in str(refused.value)


@pytest.mark.deadline(40)
async def test_a_newer_connection_of_the_node_fences_out_the_older(tmp_path, agent_dir):
    with trio.fail_after(30):
        async with _controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            older = RemoteAgent(url, token, process_agent_maker(agent_dir / "a"))
            newer = RemoteAgent(url, token, process_agent_maker(agent_dir / "b"))
            fenced = []
            async with trio.open_nursery() as nursery:

                async def run_older(task_status=trio.TASK_STATUS_IGNORED):
                    try:
                        await older.run(task_status=task_status)
                    except AgentRefused as exc:
                        fenced.append(exc.code)

                await nursery.start(run_older)
                await nursery.start(newer.run)
                await eventually(lambda: fenced, None, every=0.05)
                assert fenced == ["connection_fenced"]
                # The older one's end does not disconnect the node: the newer one's next
                # heartbeats keep it connected.
                node = await heartbeats(service, "gpu-1", 3)
                assert node.state == "connected"
                assert newer.sessions == 1
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_leases_arrive_over_the_connection_and_keep_an_attempt_running(tmp_path, agent_dir):
    from ficc_core.testing.executor_kit import new_fence, standin_job

    with trio.fail_after(30):
        async with _controller(tmp_path, lease_duration="1s") as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                agent = await nursery.start(
                    RemoteAgent(url, token, process_agent_maker(agent_dir)).run
                )
                fence = new_fence()
                await agent.launch("process", standin_job(), fence)
                await lease_carried(agent, fence, 3)  # three lease lengths, renewed
                assert agent.expired == []
                assert (await agent.status(fence)).running
                node = await service.contributors.get("gpu-1")
                assert [a.attempt_id for a in node.attempts] == [fence.attempt_id]
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(50)
async def test_an_agent_reconnects_after_the_controller_restarts(tmp_path, agent_dir, caplog):
    caplog.set_level(logging.WARNING, logger="ficc.agent")
    with trio.fail_after(40):
        async with _controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            port = url.rsplit(":", 1)[1]
        remote = RemoteAgent(
            url, token, process_agent_maker(agent_dir), backoff_initial=0.1, backoff_max=0.5
        )
        async with trio.open_nursery() as nursery:
            async with _controller(tmp_path, port=port) as (service, _):
                agent = await nursery.start(remote.run)
                await wait_connected(service, "gpu-1")
            assert remote.sessions == 1
            # The controller is gone: the agent keeps trying (two failed dials) ...
            await controller_missed(caplog, dials=2)
            assert remote.sessions == 1
            # ... then finds it back, as the same agent and node.
            async with _controller(tmp_path, port=port) as (service, _):
                await eventually(lambda: remote.sessions >= 2, None, every=0.05)
                await wait_connected(service, "gpu-1")
                assert remote.agent is agent and agent.node_id == "gpu-1"
                node = await heartbeats(service, "gpu-1", 1)
                assert node.state == "connected" and node.snapshot is not None
            assert remote.sessions == 2
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_the_controller_launches_and_stops_attempts_over_the_connection(tmp_path, agent_dir):
    from ficc_core.base.errors import FiccError
    from ficc_core.testing.executor_kit import new_fence, standin_job

    with trio.fail_after(30):
        async with _controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                agent = await nursery.start(
                    RemoteAgent(url, token, process_agent_maker(agent_dir)).run
                )
                await wait_connected(service, "gpu-1")
                fence = new_fence()
                status = await service.contributors.launch("gpu-1", "process", standin_job(), fence)
                assert status.state == "starting"
                assert [lease.fence for lease in agent.leases()] == [fence]
                with pytest.raises(FiccError) as refused:
                    await service.contributors.launch("gpu-1", "podman", standin_job(), new_fence())
                assert refused.value.code == "launch_failed"
                stopped = await service.contributors.stop("gpu-1", fence, grace=1.0)
                assert stopped.state == "stopped"
                assert agent.leases() == []
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_an_unconnected_node_takes_no_new_work(tmp_path):
    from ficc_core.base.errors import Conflict
    from ficc_core.testing.executor_kit import new_fence, standin_job

    with trio.fail_after(30):
        async with _controller(tmp_path) as (service, _):
            await service.contributors.add_node("gpu-1")
            with pytest.raises(Conflict) as refused:
                await service.contributors.launch("gpu-1", "process", standin_job(), new_fence())
            assert refused.value.code == "node_unavailable"


@pytest.mark.deadline(40)
async def test_an_https_controller_is_reached_over_tls(tmp_path, agent_dir, ca):
    import ssl

    cert = ca.issue_cert("127.0.0.1")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_pem.write_to_path(str(keyfile))
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with trio.fail_after(30):
        async with _controller(tmp_path, tls_certfile=str(certfile), tls_keyfile=str(keyfile)) as (
            service,
            url,
        ):
            assert url.startswith("https://")
            _, token = await service.contributors.add_node("gpu-1")
            remote = RemoteAgent(url, token, process_agent_maker(agent_dir), ssl_context=context)
            assert remote.url.startswith("wss://")
            async with trio.open_nursery() as nursery:
                await nursery.start(remote.run)
                await wait_connected(service, "gpu-1")
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_an_agent_that_dials_a_stopping_controller_is_told_goodbye_and_dials_again(
    tmp_path, agent_dir, caplog
):
    # Its first message was a goodbye instead of a welcome: the agent took it for a
    # refusal and ended the link for good.
    caplog.set_level(logging.INFO, logger="ficc.agent")
    with trio.fail_after(30):
        async with _controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            live = service.contributors.live
            live.closing = True  # as while the controller stops (end_node_connections)
            remote = RemoteAgent(
                url, token, process_agent_maker(agent_dir), backoff_initial=0.05, backoff_max=0.1
            )
            [link] = remote.links
            async with trio.open_nursery() as nursery:
                nursery.start_soon(remote.run)
                await eventually(lambda: link.goodbyes >= 2, None, every=0.02)
                assert link.sessions == 0 and link.away
                live.closing = False  # back: it connects
                await wait_connected(service, "gpu-1")
                await eventually(lambda: link.connected, None, every=0.02)
                assert not link.away
                nursery.cancel_scope.cancel()
    said = [r for r in caplog.records if r.name == "ficc.agent"]
    assert any("is shutting down" in r.getMessage() for r in said)
    assert not [r.getMessage() for r in said if r.levelno >= logging.WARNING]
