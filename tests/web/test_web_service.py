"""The services list and a service's page in a real browser (Debian's chromium through
Playwright) against a real controller with the real llama.cpp engine: open the page of a
service created through the API, start it from the page (with a confirmation) and watch
it become ready live, follow its replica's log live, see its usage, stop it, see a
rollout preview that does not fit say why inline, and find the start in its events.

Every page fails its test on a console error, an uncaught exception, a failed request or
a response of 400 or more the test did not provoke (``PageWatch``). With
``FICC_SCREENSHOTS=docs/ui`` the test also saves the screenshots of docs/ui.md.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
import trio

from ..conftest import bearer
from ..support.inference_support import llama_spec, open_inference_controller, register_smollm2
from ..support.web_support import (
    ALICE,
    STEP_MS,
    PageWatch,
    add_alice,
    chromium,
    chromium_or_skip,
    fits_width,
    leave_dashboard,
    log_in,
    open_page,
    screenshot,
    tolerating,
)

pytestmark = pytest.mark.slow


#: How long a SmolLM2 replica may take from start to ready.
READY_MS = 120_000
GIB = 1024**3
PIB = 1024**5


def _confirm(page, title: str, says: str, button: str | None = None) -> None:
    """The confirmation dialog asks first; Confirm (its action's name) goes ahead."""
    from playwright.sync_api import expect

    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_role("heading")).to_have_text(title)
    expect(dialog).to_contain_text(says)
    # The focus starts on Cancel: Enter never confirms by accident.
    expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
    dialog.get_by_role("button", name=button or title.split()[0], exact=True).click()
    expect(dialog).to_be_hidden()


def _act(page, watch, button: str, title: str, says: str, done: str, timeout: int = STEP_MS):
    """Press ``button``, confirm, and wait for the page to say ``done``. While the
    reconciler moves the service on (a cut-over, a replacement), the page's revision may
    be a step behind: the page says so and offers a reload, which the test takes, as a
    person would, before trying again."""
    from playwright.sync_api import expect

    status = page.locator("#action-status")
    problem = page.locator("#action-problem")
    with tolerating(watch, 409, r"/api/v1/inference/"):
        for _ in range(5):
            page.get_by_role("button", name=button, exact=True).click()
            _confirm(page, title, says, button)
            expect(status.filter(has_text=done).or_(problem).first).to_be_visible(timeout=timeout)
            if not problem.is_visible():
                expect(status).to_have_text(done)
                return
            expect(problem).to_contain_text("The service changed since this page read it")
            problem.get_by_role("button", name="Reload the service").click()
            expect(problem).to_be_hidden()
    raise AssertionError(f"{button}: the page's revision never caught up")


def _chat(url: str, token: str, service_id: str) -> None:
    """One short chat completion through the service's route, as a client would."""
    with httpx.Client(base_url=url, headers=bearer(token), timeout=60) as http:
        answer = http.post(
            f"/api/v1/inference/{service_id}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8},
        )
        assert answer.status_code == 200, answer.text


def _service_page(url: str, service_id: str, invoke_token: str, operator_token: str) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = open_page(browser, url)
        log_in(page, *ALICE, "default")

        # The dashboard's service name links to its page.
        dashboard_link = page.locator(f'#services tr[data-service-id="{service_id}"] a')
        expect(dashboard_link).to_have_attribute("href", f"/ui/services/{service_id}")
        # The dashboard goes on polling in its tab (leaving it would abort what it has
        # in flight); the service pages open in another tab of the same session.
        dashboard, dashboard_watch = page, watch
        page = dashboard.context.new_page()
        page.set_default_timeout(STEP_MS)
        watch = PageWatch(page)

        # A service this project does not have: said on its page, with nothing enabled
        # that would act on it.
        with watch.provoking(404, r"/api/v1/inference/svc_unknown(/status)?$"):
            page.goto("/ui/services/svc_unknown")
            expect(page.get_by_role("alert").first).to_have_text(
                "No such service in this project: it was removed, or it is another project's."
            )
        expect(page.get_by_role("heading", level=1)).to_have_text("No such service")
        expect(page.locator("#refreshed")).to_have_text("")
        for name in ("Start", "Drain", "Stop", "Restart", "Follow live"):
            expect(page.get_by_role("button", name=name, exact=True)).to_be_disabled()
        # The services list, from the navigation, links each service to its page.
        page.get_by_role("navigation", name="Console").get_by_role("link", name="Services").click()
        page.wait_for_url("**/ui/services")
        row = page.locator(f'#services tr[data-service-id="{service_id}"]')
        expect(row.locator("td.state .badge")).to_have_text("stopped")
        screenshot(page, "services")
        row.get_by_role("link", name="smol").click()
        page.wait_for_url(f"**/ui/services/{service_id}")

        # The page of a stopped service: its state, its replica, its specification.
        expect(page.get_by_role("heading", level=1)).to_have_text("smol")
        expect(page.locator("#state .badge")).to_have_text("stopped")
        replica = page.locator('#replicas tr[data-replica="0"]')
        expect(replica.locator("td.state .badge")).to_have_text("stopped")
        expect(replica.locator("td.node")).to_have_text("local")
        expect(page.locator("#spec")).to_contain_text("llama_cpp")
        expect(page.locator("#spec")).to_contain_text("on local: 0.5 CPU, 1 GiB")
        raw = json.loads(page.locator("#spec-json").text_content())
        assert raw["alias"] == "smol" and raw["placements"][0]["node_id"] == "local"
        expect(page.locator('#events tr[data-kind="service.created"]')).to_have_count(1)
        expect(page.get_by_role("button", name="Follow live")).to_be_disabled()
        expect(page.locator("#log-status")).to_contain_text("has not been started yet")
        # No request yet: no time to first token to say (the API's null), not "0 s".
        expect(page.locator("#usage-totals")).to_contain_text(
            "0 requests (0 errors), 0 prompt and 0 completion tokens, "
            "time to first token p50 \u2013, p99 \u2013 in the last hour."
        )

        # The rollout form, filled from the specification: a preview the schema refuses
        # says so at the field, once.
        context = page.get_by_label("Engine context (tokens)")
        expect(context).to_have_value("512")
        context.fill("0")
        with watch.provoking(400, r"/rollout/preview$"):
            page.get_by_role("button", name="Preview").click()
            expect(page.locator("#rollout-context-error")).to_contain_text("must be from 1 to")
        refusal = page.locator("#rollout-problem")
        expect(refusal).to_contain_text("$.context")
        assert refusal.text_content().count("$.context") == 1, refusal.text_content()
        page.get_by_role("button", name="Reset to the current specification").click()
        expect(refusal).to_be_hidden()
        expect(context).to_have_value("512")

        # A rollout preview that does not fit says why, inline, and cannot be rolled out.
        page.get_by_label("Memory per replica (MiB)").fill(str(PIB // 1024**2))
        page.get_by_role("button", name="Preview").click()
        expect(page.locator("#rollout-verdict")).to_have_text("The next generation does not fit.")
        refused = page.locator("#rollout-result tr.refused").first
        expect(refused.locator("td.fit")).to_have_text("does not fit")
        expect(refused.locator("td.reasons")).to_contain_text("insufficient_memory")
        expect(page.get_by_role("button", name="Roll out")).to_be_disabled()
        page.get_by_role("button", name="Reset to the current specification").click()
        expect(page.locator("#rollout-result")).to_be_empty()

        # By keyboard: Enter on Start asks; Escape answers no, and nothing is sent.
        page.get_by_role("button", name="Start", exact=True).focus()
        page.keyboard.press("Enter")
        expect(page.get_by_role("dialog")).to_be_visible()
        expect(page.get_by_role("dialog").get_by_role("button", name="Cancel")).to_be_focused()
        page.keyboard.press("Escape")
        expect(page.get_by_role("dialog")).to_be_hidden()
        expect(page.locator("#action-status")).to_have_text("")
        expect(page.locator("#state .badge")).to_have_text("stopped")

        # Started from the page, after a confirmation: ready live, no reload.
        page.evaluate("window.__sameDocument = true")
        page.get_by_role("button", name="Start", exact=True).click()
        _confirm(page, "Start smol", "Each replica is launched on its node")
        expect(page.locator("#action-status")).to_have_text("smol is starting.")
        expect(page.locator("#state .badge")).to_have_text("ready", timeout=READY_MS)
        expect(replica.locator("td.state .badge")).to_have_text("ready")
        expect(replica.locator("td.health")).to_have_text("200")
        expect(replica.locator("td.pid")).to_have_text(re.compile(r"^\d+$"))
        assert page.evaluate("window.__sameDocument") is True
        # The events list shows the start.
        start = page.locator('#events tr[data-kind="service.desired"]')
        expect(start).to_have_count(1)
        expect(start).to_contain_text("start")
        expect(page.locator('#events tr[data-kind="service.state"]').first).to_contain_text("ready")

        # Move: the only node is the replica's own, so there is nowhere it fits.
        page.get_by_role("button", name="Move replica 0…").click()
        expect(page.locator("#move-note")).to_have_text("No other connected node than local.")
        expect(page.get_by_role("button", name="Move", exact=True)).to_be_disabled()
        page.locator("#move-cancel").click()

        # The replica's log, followed live.
        page.get_by_label("Replica", exact=True).select_option("0")
        page.get_by_role("button", name="Follow live").click()
        expect(page.locator("#log-status")).to_have_text("Following replica 0's log live.")
        log = page.get_by_label("Engine log")
        expect(log).to_contain_text("ficc-llama-server: listening on")

        # A request to the service: its usage appears in the charts' totals.
        _chat(url, invoke_token, service_id)
        expect(page.locator("#usage-totals")).to_contain_text(
            "1 requests (0 errors)", timeout=30_000
        )
        expect(page.locator("#chart-requests svg")).to_have_attribute(
            "aria-label", re.compile(r"requests 1")
        )
        assert fits_width(page)
        screenshot(page, "service")

        # A rollout that fits (one request at a time instead of two): previewed, rolled
        # out after a confirmation; the next generation takes over, and the followed
        # attempt, rolled out, ends its log.
        page.get_by_label("Concurrency (requests per replica)").fill("1")
        page.get_by_role("button", name="Preview").click()
        expect(page.locator("#rollout-verdict")).to_have_text(
            "The next generation fits beside the serving one: it can be rolled out."
        )
        # The memory limit, left as it was, is recomputed for one request at a time, and
        # the preview says so; asked to, the form keeps it as it is.
        changes = page.locator("#rollout-changes")
        expect(changes).to_contain_text("(memory recomputed: the model needs about")
        keep = page.get_by_label("Keep the memory limits as they are")
        keep.check()
        expect(page.get_by_role("button", name="Roll out")).to_be_disabled()
        page.get_by_role("button", name="Preview").click()
        expect(changes).to_have_text(
            ["Concurrency: 2 requests per replica → 1 requests per replica"]
        )
        keep.uncheck()
        page.get_by_role("button", name="Preview").click()
        expect(changes).to_contain_text("(memory recomputed: the model needs about")
        expect(page.locator("#rollout-result tr.fits").first.locator("td.fit")).to_have_text("fits")
        _act(
            page,
            watch,
            "Roll out",
            "Roll out smol",
            "once every replica is ready",
            "Rollout to generation 2 started.",
        )
        expect(page.locator("#revision")).to_contain_text("generation 2", timeout=READY_MS)
        expect(page.locator("#spec")).to_contain_text("1 requests per replica")
        expect(page.locator("#state .badge")).to_have_text("ready")
        expect(log).to_contain_text("received SIGTERM, stopping")
        expect(page.locator("#log-status")).to_have_text(
            "Replica 0's attempt ended; its log is complete."
        )
        expect(page.locator('#events tr[data-kind="service.rollout"]').first).to_be_visible()

        # Restarted from the page: the answer comes once the replacement is ready.
        _act(
            page,
            watch,
            "Restart",
            "Restart smol",
            "one at a time",
            "smol restarted: replica 0 ready again.",
            timeout=READY_MS,
        )
        expect(replica.locator("td").nth(2)).to_contain_text("(generation 2)")
        expect(replica.locator("td").nth(4)).to_have_text("1")  # restarts
        # Running again after a restart it was asked for: no REASON (restart_requested)
        # under its state, as `ficc inference show` says it.
        expect(replica.locator("td.state .reason")).to_have_count(0)

        # Stopped from the page while the new attempt's log is followed: the engine's
        # own words as it stops arrive live, then the stream ends with the attempt.
        page.get_by_role("button", name="Follow live").click()
        expect(page.locator("#log-status")).to_have_text("Following replica 0's log live.")
        expect(log).to_contain_text("ficc-llama-server: listening on")
        expect(log).not_to_contain_text("received SIGTERM")
        _act(
            page, watch, "Stop", "Stop smol", "in flight end with the engines", "smol is stopping."
        )
        expect(log).to_contain_text("received SIGTERM, stopping")
        expect(page.locator("#log-status")).to_have_text(
            "Replica 0's attempt ended; its log is complete."
        )
        expect(page.locator("#state .badge")).to_have_text("stopped", timeout=60_000)
        # The start is older than the newest 20 events shown: asked for, it is listed.
        _every_event(page)
        expect(page.locator('#events tr[data-kind="service.desired"]')).to_have_count(2)
        expect(page.locator('#events tr[data-kind="replica.restarted"]').first).to_be_visible()

        # At phone width nothing overflows the page.
        page.set_viewport_size({"width": 390, "height": 844})
        expect(page.locator("#state .badge")).to_have_text("stopped")
        assert fits_width(page)
        screenshot(page, "service-phone")
        page.set_viewport_size({"width": 1280, "height": 900})

        # Another client changes the service while this page still shows what it read
        # (its reads of the service answered from that, as if they had not come yet):
        # the page's start names the revision it read and is refused, with a reload.
        _stale_start(page, watch, url, service_id, operator_token)
        watch.check()
        dashboard_watch.check()


def _every_event(page) -> None:
    """Show older events until the page says it lists every event on record."""
    from playwright.sync_api import expect

    count = page.locator("#events-count")
    for _ in range(20):
        before = count.text_content()
        if before.startswith("All "):
            return
        page.get_by_role("button", name="Show older events").click()
        expect(count).not_to_have_text(before)
    expect(count).to_have_text(re.compile(r"^All \d+ events on record"))


def _stale_start(page, watch, url: str, service_id: str, token: str) -> None:
    from playwright.sync_api import expect

    path = f"/api/v1/inference/{service_id}"
    with httpx.Client(base_url=url, headers=bearer(token), timeout=30) as http:
        read = http.get(path)
        revision = read.json()["revision"]
        expect(page.locator("#revision")).to_contain_text(f"revision {revision},")
        page.route(
            re.compile(re.escape(path) + "$"),
            lambda route: route.fulfill(
                status=200, content_type="application/json", body=read.text
            ),
        )
        for action in ("start", "stop"):
            # The reconciler moves the revision on as the replica launches: read again
            # until the action names the current one.
            for _ in range(50):
                current = http.get(path).json()["revision"]
                changed = http.post(f"{path}/control/{action}", json={"revision": current})
                if changed.status_code != 409:
                    break
            assert changed.status_code == 200, changed.text
    page.get_by_role("button", name="Start", exact=True).click()
    with watch.provoking(409, re.escape(path) + "/control/start$"):
        _confirm(page, "Start smol", "Each replica is launched on its node")
        problem = page.locator("#action-problem")
        expect(problem).to_contain_text(
            f"The service changed since this page read it (revision {revision} read"
        )
    page.unroute(re.compile(re.escape(path) + "$"))
    problem.get_by_role("button", name="Reload the service").click()
    expect(problem).to_be_hidden()
    expect(page.locator("#action-status")).to_have_text(re.compile(r"^Reloaded: revision \d+\.$"))
    assert f"revision {revision}," not in page.locator("#revision").text_content()
    expect(page.locator("#state .badge")).to_have_text("stopped", timeout=60_000)


@pytest.mark.deadline(610)
async def test_a_service_page_starts_follows_logs_stops_and_previews_a_rollout(tmp_path):
    chromium_or_skip()
    with trio.fail_after(600):
        async with open_inference_controller(tmp_path, console_refresh=0.5) as controller:
            await add_alice(controller)
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id, alias="smol", cpus=0.5)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            # A service-bound invoke token, as a client of the service holds.
            issued = await controller.ok(
                "POST",
                f"/api/v1/inference/{created['id']}/tokens",
                status=201,
                json={"lifetime": 600},
            )
            await trio.to_thread.run_sync(
                _service_page,
                controller.url,
                created["id"],
                issued["token"],
                controller.token,
                abandon_on_cancel=True,
            )


def _pin_and_unpin(url: str, service_id: str) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = open_page(browser, url, width=390, height=844)
        log_in(page, *ALICE, "default")
        dashboard, dashboard_watch = page, watch
        page = dashboard.context.new_page()
        page.set_default_timeout(STEP_MS)
        watch = PageWatch(page)
        page.goto(f"/ui/services/{service_id}")
        expect(page.locator("#revision")).to_contain_text("scaling 0 running, min 0, max 1")
        pin = page.get_by_role("button", name="Pin", exact=True)
        unpin = page.get_by_role("button", name="Unpin", exact=True)
        expect(unpin).to_be_hidden()

        # Started from the page, an on-demand service waits idle for its first request.
        page.get_by_role("button", name="Start", exact=True).click()
        _confirm(page, "Start on-demand", "Each replica is launched on its node")
        expect(page.locator("#state .badge")).to_have_text("idle")
        # Pinned, it wakes at once and is never scaled to zero.
        _act(page, watch, "Pin", "Pin on-demand", "never scaled to zero", "on-demand is pinned.")
        expect(page.locator("#revision")).to_contain_text("pinned")
        expect(pin).to_be_hidden()
        expect(page.locator("#state .badge")).to_have_text("ready", timeout=READY_MS)
        _move_to_a_node_that_fits(page)
        _act(
            page,
            watch,
            "Unpin",
            "Unpin on-demand",
            "It may be scaled to zero again",
            "on-demand is no longer pinned.",
        )
        expect(pin).to_be_visible()
        expect(page.locator("#revision")).not_to_contain_text("pinned")
        assert fits_width(page)

        # Drained from the page: it stops once nothing is in flight.
        _act(page, watch, "Drain", "Drain on-demand", "refused at once", "on-demand is draining.")
        expect(page.locator("#state .badge")).to_have_text("stopped", timeout=60_000)
        expect(page.locator('#events tr[data-kind="service.desired"]')).to_contain_text(["drain"])
        watch.check()
        dashboard_watch.check()


def _plan(node_id: str, reasons: list[dict[str, str]]) -> dict:
    replica = {
        "index": 0,
        "node_id": node_id,
        "held": True,
        "fits": not reasons,
        "reservation": {"cpus": 0.5, "memory_bytes": GIB, "disk_bytes": 0, "gpus": []},
        "reasons": reasons,
    }
    return {"fits": not reasons, "plan_digest": "sha256:0", "replicas": [replica], "nodes": []}


def _move_to_a_node_that_fits(page) -> None:
    """Move lists the nodes the replica fits on, as the server's previews say. This machine
    has one node, so two more (one with room, one without) and their previews and the
    move's answer are made up here, for this page only; the page's code is the real one."""
    from playwright.sync_api import expect

    def contributors(route) -> None:
        answer = route.fetch()
        nodes = answer.json()
        for node_id in ("gpu-2", "busy-3"):
            nodes["contributors"].append({"id": node_id, "name": node_id, "state": "connected"})
        route.fulfill(response=answer, json=nodes)

    def preview(route) -> None:
        node_id = route.request.post_data_json["spec"]["placements"][0]["node_id"]
        full = [{"code": "insufficient_memory", "message": "busy-3 has 0 B of memory free"}]
        plan = _plan(node_id, full if node_id == "busy-3" else [])
        route.fulfill(json={**plan, "spec": {}, "beside_serving": plan})

    moved = []

    def move(route) -> None:
        moved.append(route.request.post_data_json)
        route.fulfill(
            json={"final_state": "moved", "from_node": "local", "to_node": "gpu-2", "steps": []}
        )

    page.route(re.compile(r"/api/v1/contributors$"), contributors)
    page.route(re.compile(r"/rollout/preview$"), preview)
    page.route(re.compile(r"/replicas/0/move$"), move)
    page.get_by_role("button", name="Move replica 0…").click()
    note = page.locator("#move-note")
    expect(note).to_contain_text("It fits on 1 of 2 other node(s).")
    expect(note).to_contain_text("busy-3: busy-3 has 0 B of memory free")
    target = page.get_by_label("Target node")
    expect(target.locator("option")).to_have_text(["gpu-2"])
    expect(target).to_be_focused()
    page.get_by_role("button", name="Move", exact=True).click()
    _confirm(page, "Move replica 0", "from local to gpu-2")
    expect(page.locator("#action-status")).to_have_text("Replica 0: moved (local → gpu-2).")
    expect(page.locator("#move-form")).to_be_hidden()
    [body] = moved
    assert body["target_node_id"] == "gpu-2" and isinstance(body["revision"], int)
    page.unroute_all()


@pytest.mark.deadline(610)
async def test_a_scaled_service_is_pinned_unpinned_and_drained_from_its_page(tmp_path):
    chromium_or_skip()
    with trio.fail_after(600):
        async with open_inference_controller(tmp_path, console_refresh=0.5) as controller:
            await add_alice(controller)
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id, alias="on-demand", cpus=0.5)
            spec["scaling"] = {"min": 0, "max": 1}
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            await trio.to_thread.run_sync(
                _pin_and_unpin, controller.url, created["id"], abandon_on_cancel=True
            )


def _quick_stop_and_removal(url: str, token: str, service_id: str) -> None:
    """Polling slowly (every minute), the page's revision is always older than the
    service's: Stop right after Start still stops, since each action reads the revision
    afresh. Then the service is removed by another client: the next poll says it no
    longer exists, disables every action and polls no more."""
    from playwright.sync_api import expect

    path = f"/api/v1/inference/{service_id}"
    with (
        chromium(chromium_or_skip()) as browser,
        httpx.Client(base_url=url, headers=bearer(token), timeout=30) as http,
    ):
        page, watch = open_page(browser, url)
        log_in(page, *ALICE, "default")
        leave_dashboard(page, f"/ui/services/{service_id}")
        expect(page.locator("#state .badge")).to_have_text("stopped")
        page.get_by_role("button", name="Start", exact=True).click()
        _confirm(page, "Start smol", "Each replica is launched on its node")
        expect(page.locator("#action-status")).to_have_text("smol is starting.")
        # The page read the service once more after the start; the replica's launch
        # moves the revision on past that read.
        shown = re.search(r"revision (\d+),", page.locator("#revision").text_content())
        assert shown is not None
        for _ in range(200):
            if http.get(path).json()["revision"] != int(shown.group(1)):
                break
            time.sleep(0.02)
        else:
            raise AssertionError("the revision never moved on after the start")
        page.get_by_role("button", name="Stop", exact=True).click()
        _confirm(page, "Stop smol", "in flight end with the engines")
        expect(page.locator("#action-status")).to_have_text("smol is stopping.")
        expect(page.locator("#action-problem")).to_be_hidden()
        assert http.get(path).json()["desired"] == "stopped"

        # Removed by another client once stopped.
        for _ in range(600):
            view = http.get(path).json()
            if view["state"] == "stopped":
                removed = http.post(f"{path}/control/remove", json={"revision": view["revision"]})
                if removed.status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise AssertionError("the service was never removed")
        for _ in range(600):
            if http.get(path).status_code == 404:
                break
            time.sleep(0.05)
        asked: list[str] = []
        page.on("request", lambda r: path in r.url and asked.append(r.url))
        with watch.provoking(404, re.escape(path) + "(/status)?$"):
            page.get_by_label("Window").select_option("21600")  # reads the service now
            expect(page.locator("#problem")).to_have_text(
                "This service no longer exists: it was removed while this page was open."
            )
        expect(page.locator("#state .badge")).to_have_text("removed")
        expect(page.locator("#refreshed")).to_have_text("No longer refreshed.")
        for name in ("Start", "Drain", "Stop", "Restart", "Follow live", "Preview"):
            expect(page.get_by_role("button", name=name, exact=True)).to_be_disabled()
        # Polling stopped: a change that would read the service at once asks nothing.
        before = len(asked)
        page.get_by_label("Window").select_option("3600")
        page.wait_for_timeout(500)
        assert len(asked) == before, asked[before:]
        watch.check()


@pytest.mark.deadline(610)
async def test_stop_right_after_start_stops_and_a_removed_service_is_said_gone(tmp_path):
    chromium_or_skip()
    with trio.fail_after(600):
        async with open_inference_controller(tmp_path, console_refresh=60) as controller:
            await add_alice(controller)
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id, alias="smol", cpus=0.5)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            await trio.to_thread.run_sync(
                _quick_stop_and_removal,
                controller.url,
                controller.token,
                created["id"],
                abandon_on_cancel=True,
            )


_CHART = """async ([formatUrl, chartsUrl]) => {
  const { number } = await import(formatUrl);
  const { lineChart } = await import(chartsUrl);
  const box = document.createElement("div");
  document.body.append(box);
  lineChart(box, {
    title: "Requests",
    times: [0, 60, 120],
    series: [{ name: "requests", values: [0, 12, 20], class: "s1" }],
    format: (v) => number(v, 0),
  });
  const svg = box.querySelector("svg");
  return {
    numbers: [[10, 0], [100, 0], [0, 0], [0, 3], [12.5, 2], [3, 2], [0.1234, 3]].map(
      ([v, d]) => number(v, d),
    ),
    axis: [...svg.querySelectorAll("text.axis")].slice(0, 3).map((t) => t.textContent),
    points: [...svg.querySelectorAll("circle title")].map((t) => t.textContent.split(": ")[1]),
    label: svg.getAttribute("aria-label"),
  };
}"""


def test_the_charts_say_whole_numbers_and_zero(live_server):
    """The usage charts' axis, points and accessible name from the page's own modules:
    10 and 20 keep their zeros, 0 is said as 0 (js/format.js's number)."""
    from ficc_core.web import Assets

    assets = Assets.load()
    with chromium(chromium_or_skip()) as browser:
        page, watch = open_page(browser, live_server.url)
        page.goto("/")
        drawn = page.evaluate(_CHART, [assets.url("js/format.js"), assets.url("js/charts.js")])
        assert drawn["numbers"] == ["10", "100", "0", "0", "12.5", "3", "0.123"]
        assert drawn["axis"] == ["0", "10", "20"]
        assert drawn["points"] == ["0", "12", "20"]
        assert drawn["label"] == "Requests: latest bucket requests 20"
        watch.check()
