"""A change of leader while a replica's engine is still stopping: no second engine beside it.

The soak bench (#46) found a node running one engine more than its placements for
a few seconds after a controller was SIGKILLed in the middle of a replica restart:
the new leader found the old attempt gone (the node had forgotten it when the old
leader's link dropped) and launched the replacement while the old engine still ran.

Two controllers share one store (SQLite, one data directory), node ``gpu-1`` is a
remote agent linked to both, and its one replica runs the stand-in engine, which
ignores SIGTERM: a stop ends only at its grace's SIGKILL (10 s), so the restart's
stop is still in flight when the leader goes. Every 50 ms the test counts the
engines on the node; the new leader must finish the stop, launch the replacement
only once the node confirmed the old engine ended, and never route the stopping
attempt again.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from ficc_core.agent.remote import RemoteAgent
from ficc_core.auth import ALL_SCOPES

from ..conftest import issue_token
from ..support.agent_support import open_controller
from ..support.inference_support import (
    Controller,
    node_llama_spec,
    register_gguf,
    write_agent_settings,
)
from ..support.models_support import tiny_gguf
from ..support.ops_support import _node_factory
from ..support.waiting import eventually

#: A short leader lease, so the standby takes over within the test's bounds.
TEMPO = {"leader_lease": "2s", "leader_renew_interval": "0.5s"}


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="ft-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _engine(folder: Path, marker: str) -> tuple[Path, Path]:
    """The stand-in engine ignoring SIGTERM, named by ``marker`` on its command line,
    and agent settings declaring it as the llama_server runtime."""
    engine = folder / "stubborn-llama-server"
    engine.write_text(
        f"#!/bin/sh\nexec {sys.executable} -m ficc_core.testing.standin_engine "
        f"--ignore-sigterm --alias {marker}\n"
    )
    engine.chmod(0o755)
    return engine, write_agent_settings(folder, engine)


def _engines(marker: str) -> int:
    """How many live (not zombie) processes name ``marker`` on their command line."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in command and b"standin_engine" in command and state != "Z":
            count += 1
    return count


async def _controller(tmp_path: Path, *, task_status):
    """Serve a controller until the scope it reports is cancelled: gone at once, as a
    killed process (its work cancelled mid-call, its node links dropped)."""
    with trio.CancelScope() as scope:
        async with open_controller(tmp_path, embedded_agent=False, **TEMPO) as served:
            task_status.started((scope, *served))
            await trio.sleep_forever()


@pytest.mark.deadline(150)
async def test_a_new_leader_finishes_the_stop_before_the_replacement_launches(tmp_path, agent_dir):
    marker = f"stop-takeover-{secrets.token_hex(4)}"
    engine, settings = _engine(tmp_path, marker)
    counts: list[int] = []

    async def count_engines(stop: trio.Event) -> None:
        while not stop.is_set():
            counts.append(await trio.to_thread.run_sync(_engines, marker))
            await trio.sleep(0.05)

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            kill_a, a, url_a = await nursery.start(_controller, tmp_path)
            async with open_controller(tmp_path, embedded_agent=False, **TEMPO) as (b, url_b):
                assert a.lease.leading and not b.lease.leading
                await a.auth.bootstrap()
                token = await issue_token(a, scopes=ALL_SCOPES, name="operator")
                _, credential = await a.contributors.add_node("gpu-1")
                remote = RemoteAgent([url_a, url_b], credential, _node_factory(agent_dir, settings))
                async with (
                    trio.open_nursery() as inner,
                    httpx.AsyncClient(base_url=url_a, timeout=30) as http_a,
                    httpx.AsyncClient(base_url=url_b, timeout=30) as http_b,
                ):
                    agent = await inner.start(remote.run)
                    via_a = Controller(a, url_a, token, http_a)
                    via_b = Controller(b, url_b, token, http_b)
                    node = await via_a.wait_node("gpu-1")
                    while not (node["snapshot"] or {}).get("runtimes"):
                        await trio.sleep(0.05)
                        node = await via_a.node("gpu-1")
                    tiny_gguf(tmp_path / "tiny.gguf", size=64 << 10)
                    model_id = await register_gguf(via_a, tmp_path / "tiny.gguf", "tiny")
                    limits = {"cpus": 1, "memory_bytes": 256 << 20}
                    spec = node_llama_spec(node, model_id, [{"node_id": "gpu-1", "limits": limits}])
                    spec["image_executable"] = str(engine)
                    created = await via_a.ok("POST", "/api/v1/inference", status=201, json=spec)
                    sid = created["id"]
                    assert (await via_a.control(sid, "start")).status_code == 200
                    await via_a.wait_service(sid, lambda v: v["state"] == "ready")
                    [lease] = agent.leases()
                    first = lease.fence.attempt_id

                    sampled = trio.Event()
                    inner.start_soon(count_engines, sampled)
                    # The leader restarts the replica: its stop goes to the node, whose
                    # engine ignores the SIGTERM ...
                    view = await via_a.ok("GET", f"/api/v1/inference/{sid}")

                    async def restart() -> None:  # answered once the stop ends (or A is gone)
                        with contextlib.suppress(httpx.HTTPError):
                            await via_a.call(
                                "POST",
                                f"/api/v1/inference/{sid}/replicas/0/restart",
                                json={"revision": view["revision"]},
                            )

                    inner.start_soon(restart)

                    # (The provider's own record of the engine: its stop has begun.)
                    engine_of = agent.providers["process"]._attempts[first]
                    await eventually(lambda: engine_of.stop_requested, None, every=0.02)
                    assert _engines(marker) == 1
                    # ... and the leader is gone while the stop is in flight.
                    kill_a.cancel()
                    while not b.lease.leading:  # noqa: ASYNC110
                        await trio.sleep(0.05)

                    # The new leader serves the replica again, from a new attempt.
                    def replaced(status: dict) -> bool:
                        [replica] = status["replicas"]
                        return replica["state"] == "ready" and replica["attempt_id"] != first

                    await via_b.wait_status(sid, replaced, period=0.1)
                    sampled.set()
                    events = await via_b.ok(
                        "GET", f"/api/v1/inference/{sid}/events", params={"after": 0, "limit": 500}
                    )
                    inner.cancel_scope.cancel()
            nursery.cancel_scope.cancel()

    # Never two engines for the one placement, and the stopping attempt never served
    # again: it went from stopping to stopped only, released once its engine had ended.
    assert counts and max(counts) == 1, counts
    changes = [
        e["details"]
        for e in events["events"]
        if e["kind"] == "attempt.state" and e.get("attempt_id") == first
    ]
    moves = [(c["state"]["from"], c["state"]["to"]) for c in changes]
    after = moves[moves.index(("ready", "stopping")) + 1 :]
    assert after == [("stopping", "stopped")], moves
    assert changes[-1]["released"], changes
