"""The leader's tidying of partials never touches an upload live through another controller.

Two real controllers share one store (SQLite, then PostgreSQL) and one blob directory.
Controller B leads and takes an upload; it is paused (SIGSTOP, a VM stalled) with a
write under way, so controller A becomes leader and tidies the shared partials. What B
had under way is left alone; once B answers again its upload goes on through B,
completes and verifies; and what stays idle past ``partial_tidy_after`` is tidied.
"""

from __future__ import annotations

import hashlib
import os
import signal

import pytest
import trio

from ..support.ha_support import Api, ControllerProcess, controller_env
from ..support.models_support import gguf_manifest, partial_file
from ..support.serve_support import first_run_secrets
from ..support.waiting import eventually

MiB = 1 << 20
OCTET = {"Content-Type": "application/octet-stream"}
TEMPO = {
    "leader_lease": "3",
    "leader_renew_interval": "1",
    "partial_tidy_after": "8",
    "log_level": "info",
}

pytestmark = pytest.mark.slow


@pytest.mark.deadline(130)
async def test_a_new_leader_leaves_a_live_upload_through_another_controller_alone(
    tmp_path, database_url
):
    import httpx

    data = tmp_path / "data"
    b = ControllerProcess(controller_env(data, database_url, "ctl-b", **TEMPO), tmp_path / "b.log")
    a = ControllerProcess(controller_env(data, database_url, "ctl-a", **TEMPO), tmp_path / "a.log")
    content = os.urandom(12 * MiB)
    sha = hashlib.sha256(content).hexdigest()
    stopped = False
    try:
        with trio.fail_after(120):
            url_b = await b.start()
            token = first_run_secrets(data / "first-run-secrets")["admin token"]
            url_a = await a.start()
            async with httpx.AsyncClient(timeout=30) as http:
                api_a, api_b = Api(url_a, token, http), Api(url_b, token, http)
                assert (await api_b.leader())["leader"]["id"] == "ctl-b"
                model = await api_b.ok(
                    "POST", "/api/v1/models", 201, json=gguf_manifest("m", content)
                )
                other = await api_b.ok(
                    "POST", "/api/v1/models", 201, json=gguf_manifest("n", content[:MiB])
                )
                path = f"/api/v1/models/{model['id']}/files/0/bytes"
                await api_b.ok(
                    "POST", path, params={"offset": 0}, content=content[: 4 * MiB], headers=OCTET
                )

                # B is paused in the middle of writes: the next piece of this upload past
                # its durable offset, and the first piece of another model's file (no
                # row records it yet).
                partial = partial_file(data, sha, model["id"])
                with partial.open("ab") as file:
                    file.write(content[4 * MiB : 6 * MiB])
                first = partial_file(data, hashlib.sha256(content[:MiB]).hexdigest(), other["id"])
                first.write_bytes(content[: MiB // 2])
                os.kill(b.proc.pid, signal.SIGSTOP)
                stopped = True

                await api_a.until(
                    "GET",
                    "/api/v1/system/controllers",
                    lambda body: (body.get("leader") or {}).get("id") == "ctl-a",
                )
                # A leads and has tidied (its start's round): B's writes are untouched.
                await _tidied(a, 1)
                assert first.exists() and first.stat().st_size == MiB // 2
                assert partial.stat().st_size == 6 * MiB

                os.kill(b.proc.pid, signal.SIGCONT)
                stopped = False
                # B answers again; its upload goes on from the durable offset through B.
                for offset in range(4 * MiB, len(content), 4 * MiB):
                    done = await api_b.ok(
                        "POST",
                        path,
                        params={"offset": offset},
                        content=content[offset : offset + 4 * MiB],
                        headers=OCTET,
                    )
                assert done["state"] == "verified"
                published = data / "blobs" / "sha256" / sha
                assert hashlib.sha256(published.read_bytes()).hexdigest() == sha

                # The other file's first write never finished (B's process lost it):
                # once idle past partial_tidy_after, the leader's next rounds tidy it.
                with trio.fail_after(40):
                    await eventually(lambda: not first.exists(), None, every=0.2)
    finally:
        if stopped:
            os.kill(b.proc.pid, signal.SIGCONT)
        for controller in (a, b):
            controller.stop()


async def _tidied(controller: ControllerProcess, rounds: int) -> None:
    """Wait until ``controller``'s log says it tidied partials ``rounds`` times."""
    with trio.fail_after(30):
        await eventually(
            lambda: controller.output().count("tidied the partials") >= rounds, None, every=0.1
        )
