"""What `ficc inference list/show/events` and `/metrics` say of a real `ficc serve`.

A plain `ficc serve` with its embedded node and two llama.cpp replicas of the real
SmolLM2, read through the `ficc` executable as an operator does: a normal start goes
starting → ready; `list` names the model; a replica restarted on request shows how its
last attempt ended but no REASON; a stopped service's replicas show no PID and no
HEALTH; the scrape has no `*_created` series.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from ..support.models_support import smollm2_path
from ..support.serve_support import ServeProcess, ficc_command
from ..support.waiting import eventually

pytestmark = pytest.mark.slow


def _rows(shown: str) -> dict[str, list[str]]:
    """The replicas table of `ficc inference show`: each row's cells by replica index."""
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("REPLICA  STATE"))
    rows = {}
    for line in lines[start + 1 :]:
        if not re.match(r"^\d+\s", line):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells
    return rows


@pytest.mark.deadline(610)
async def test_start_list_restart_stop_and_metrics_say_what_an_operator_needs(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("FICC_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    ficc = ficc_command(env)

    async def status() -> dict:
        return json.loads(await ficc("inference", "show", "smollm2", "--json"))["status"]

    async def until(predicate) -> dict:
        return await eventually(
            status, None, until=lambda found: predicate(found["replicas"]), every=0.2
        )

    data = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    serve = ServeProcess(data)
    try:
        with trio.fail_after(600):
            url, _ = await serve.log_in_admin(ficc)
            added = await ficc("models", "add", str(smollm2_path()))
            model_id = re.search(r"\(ID (\w+)\)", added).group(1)
            await ficc(
                "inference", "create", "--model", "smollm2", "--engine", "llama_cpp",
                "--replicas", "2", "--yes", "--wait",
            )  # fmt: skip

            # A normal start: starting → ready, never through degraded.
            events = json.loads(
                await ficc("inference", "events", "smollm2", "--json", "--limit", "500")
            )["events"]
            states = [
                (e["details"]["state"]["from"], e["details"]["state"]["to"])
                for e in events
                if e["kind"] == "service.state"
            ]
            assert states == [("starting", "ready")], states

            # list names the model (its ID stays in --json).
            listed = await ficc("inference", "list")
            header, row = listed.splitlines()[:2]
            cells = dict(zip(header.split(), row.split(), strict=True))
            assert (cells["ALIAS"], cells["MODEL"]) == ("smollm2", "smollm2"), listed
            assert model_id not in listed
            [view] = json.loads(await ficc("inference", "list", "--json"))["services"]
            assert view["model_id"] == model_id

            # A restart asked for: LAST EXIT says how the old attempt ended, REASON nothing.
            before = (await status())["replicas"][0]
            await ficc("inference", "restart", "smollm2", "--replica", "0")
            after = await until(
                lambda rs: rs[0]["attempt"] == before["attempt"] + 1 and rs[0]["health"] == "200"
            )
            last = after["replicas"][0]["last_exit"]
            assert (last["reason"], last["failed"]) == ("restart_requested", False)
            row = _rows(await ficc("inference", "show", "smollm2"))["0"]
            # REPLICA STATE NODE ATTEMPT PID RESTARTS LAST EXIT HEALTH IN-FLIGHT REASON
            assert row[1] == "ready" and row[5] == "1", row
            assert (row[6], row[7], row[9]) == ("restart_requested", "200", "-"), row

            # Stopped: no PID and no HEALTH of an engine that no longer runs.
            await ficc("inference", "stop", "smollm2", "--wait")
            rows = _rows(await ficc("inference", "show", "smollm2"))
            for index in ("0", "1"):
                state, pid, health, reason = (rows[index][i] for i in (1, 4, 7, 9))
                assert (state, pid, health, reason) == ("stopped", "-", "-", "stopped"), rows

            scraped = await trio.to_thread.run_sync(lambda: httpx.get(f"{url}/metrics", timeout=10))
            assert scraped.status_code == 200
            assert "ficc_gateway_requests_total" in scraped.text or "ficc_http_requests_total" in (
                scraped.text
            )
            assert "_created" not in scraped.text
    finally:
        serve.proc.terminate()
        serve.kill()
        shutil.rmtree(data, ignore_errors=True)
