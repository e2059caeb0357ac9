"""Moving a replica from its service's page to another real node, in a real browser
(Debian's chromium through Playwright): the embedded node ``local`` and a remote agent
``node-2`` dialling the controller as ``ficc executor`` does (tests/support/ops_support.py; the
stand-in engine there is the one edge faked, a vLLM that answers at once).

The page offers only the nodes the replica fits on (the server's previews say), asks
first, and the replica then serves from ``node-2``: the move went through the real
route, nodes and engines, not a page-side stand-in.
"""

from __future__ import annotations

import pytest
import trio

from ficc_core.auth import ALL_SCOPES

from ..support.ops_support import open_two_nodes
from ..support.web_support import (
    STEP_MS,
    chromium,
    chromium_or_skip,
    leave_dashboard,
    log_in,
    open_page,
)
from .test_web_service import _confirm

pytestmark = pytest.mark.slow

OPERATOR = ("olga", "olga-password-1")


def _move_from_the_page(url: str, service_id: str) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = open_page(browser, url)
        log_in(page, *OPERATOR, "default")
        leave_dashboard(page, f"/ui/services/{service_id}")
        expect(page.locator("#state .badge")).to_have_text("ready")
        page.get_by_role("button", name="Move replica 0…").click()
        target = page.get_by_label("Target node")
        expect(target.locator("option")).to_have_text(["node-2"])
        expect(page.locator("#move-note")).to_contain_text("It fits on 1 of 1 other node(s).")
        page.get_by_role("button", name="Move", exact=True).click()
        _confirm(page, "Move replica 0", "from local to node-2")
        expect(page.locator("#action-status")).to_have_text(
            "Replica 0: moved (local → node-2).", timeout=4 * STEP_MS
        )
        # The replicas table follows: replica 0 serves from node-2 now.
        expect(page.locator("#replicas")).to_contain_text("node-2")
        watch.check()


@pytest.mark.deadline(310)
async def test_a_replica_moves_to_another_node_from_its_page(tmp_path) -> None:
    chromium_or_skip()
    with trio.fail_after(300):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            await controller.ok(
                "POST",
                "/api/v1/users",
                status=201,
                json={
                    "username": OPERATOR[0],
                    "password": OPERATOR[1],
                    "projects": {"default": sorted(set(ALL_SCOPES) - {"admin"})},
                },
            )
            service_id = await ops.running("local")
            await trio.to_thread.run_sync(
                _move_from_the_page, controller.url, service_id, abandon_on_cancel=True
            )
            view = await controller.wait_service(
                service_id,
                lambda v: v["state"] == "ready" and v["replicas"][0]["node_id"] == "node-2",
            )
            assert view["spec"]["placements"][0]["node_id"] == "node-2"
            assert await ops.reservations(service_id) == [(view["generation"], 0, "node-2")]
