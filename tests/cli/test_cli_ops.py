"""``ficc inference move|bulk-move|restart|rollout`` against a real controller with two
nodes (tests/support/ops_support.py)."""

from __future__ import annotations

import pytest
import trio

from ..support.ops_support import open_two_nodes
from .test_cli_inference import Cli


@pytest.mark.deadline(130)
async def test_move_rollout_restart_and_bulk_move_from_the_command_line(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            run = Cli(controller.url, controller.token)
            service_id = await ops.running("local")

            moved = await run.ok("move", "tiny", "--replica", "0", "--to", "node-2")
            assert "moved (local -> node-2)" in moved.stdout
            for step in ("deploy_target", "wait_target_health", "update_binding"):
                assert step in moved.stdout

            rolled = await run.ok("rollout", "tiny", "--replicas", "2", "--wait")
            assert "serves" in rolled.stdout
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert [p["node_id"] for p in view["spec"]["placements"]] == ["node-2", "node-2"]

            restarted = await run.ok("restart", "tiny", "--replica", "1")
            assert restarted.stdout.splitlines()[0].split() == ["REPLICA", "OK", "FROM", "TO", "MS"]

            # One moves, one is refused: the rest still runs, the exit status says so.
            bulk = await run("bulk-move", "tiny:0", "tiny:7", "--to", "local")
            assert bulk.exit_code == 1, bulk.output
            assert "1 of 2 moved, 1 failed" in bulk.stdout
            assert "tiny has no replica 7; it has 2" in bulk.stdout

            stopped = await run("move", "tiny", "--replica", "0", "--to", "no-such-node")
            assert stopped.exit_code == 1
            assert "[node_not_found]" in stopped.stderr
