"""A service page's events, log and rollout form in a real browser (Debian's chromium
through Playwright) against a real controller whose engine is the stand-in (quick to
start and stop, its log lines real): the events are the newest few in an area of bounded
height, older pages read on request with the events route's ``before`` cursor; the log
pane shows the replica's latest lines as the page opens, without Follow; the rollout is
a form (context, concurrency, replicas, limits, strategy) whose preview says what would
change, whose refusals are shown at their fields, and which rolls out what it previewed.

Every page fails its test on a console error, an uncaught exception, a failed request or
a response of 400 or more the test did not provoke (``PageWatch``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio

from ..support.inference_support import (
    llama_spec,
    open_inference_controller,
    register_gguf,
    standin_engine,
    write_agent_settings,
)
from ..support.models_support import tiny_gguf
from ..support.web_support import (
    ALICE,
    add_alice,
    chromium,
    chromium_or_skip,
    fits_width,
    leave_dashboard,
    log_in,
    open_page,
    screenshot,
)
from .test_web_service import _act

pytestmark = pytest.mark.slow

#: The events the page shows at first (service.js's EVENTS_PAGE).
PAGE = 20
MIB = 1024**2


def _ready(view: dict) -> bool:
    return view["state"] == "ready"


def _stopped(view: dict) -> bool:
    return view["state"] == "stopped" and view["desired"] == "stopped"


async def _tiny_service(controller, tmp_path: Path, engine: Path) -> str:
    """Alice added, a tiny model registered and a service of it on ``engine`` created
    (not started); its id."""
    await add_alice(controller)
    tiny_gguf(tmp_path / "tiny.gguf", size=64 << 10)
    model_id = await register_gguf(controller, tmp_path / "tiny.gguf", "tiny")
    spec = await llama_spec(controller, model_id, cpus=0.5, memory_bytes=256 * MIB)
    spec["image_executable"] = str(engine)
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    return created["id"]


async def _cycle(controller, service_id: str, action: str, settled) -> None:
    """A control action at the current revision, then wait until the service settles."""
    for _ in range(20):
        response = await controller.control(service_id, action)
        if response.status_code != 409:
            break
    assert response.status_code == 200, response.text
    try:
        with trio.fail_after(60):
            await controller.wait_service(service_id, settled)
    except trio.TooSlowError:
        view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
        raise AssertionError(f"{action}: the service never settled: {view}") from None


def _rolled_out(page, watch, generation: int) -> None:
    """Roll out the form's change (one that waits for every replica to be ready) and wait
    until the page shows ``generation``."""
    from playwright.sync_api import expect

    _act(
        page,
        watch,
        "Roll out",
        "Roll out smol",
        "once every replica is ready",
        f"Rollout to generation {generation} started.",
    )
    expect(page.locator("#revision")).to_contain_text(f"generation {generation}", timeout=60_000)


def _panes(url: str, service_id: str, events: list[dict], generation: int) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = open_page(browser, url)
        log_in(page, *ALICE, "default")
        leave_dashboard(page, f"/ui/services/{service_id}")
        expect(page.locator("#state .badge")).to_have_text("ready")

        # The log pane shows the replica's latest lines at once: no Follow pressed.
        log = page.get_by_label("Engine log")
        expect(log).to_contain_text("standin engine listening on")
        expect(page.locator("#log-status")).to_have_text(
            re.compile(r"of replica 0's attempt \d+ \(ready\)\. Follow live to see new ones\.$")
        )
        expect(log).not_to_have_class(re.compile(r"\bno-lines\b"))
        expect(page.get_by_role("button", name="Follow live")).to_be_enabled()

        # The events: the newest PAGE, newest first, in an area that scrolls.
        rows = page.locator("#events tbody tr")
        expect(rows).to_have_count(PAGE)
        newest = [str(e["id"]) for e in reversed(events)]
        expect(rows.first).to_have_attribute("data-event-id", newest[0])
        count = page.locator("#events-count")
        expect(count).to_have_text(f"The latest {PAGE} events, newest first.")
        area = page.locator("#events-scroll")
        box = area.bounding_box()
        assert box is not None and box["height"] <= 29 * 16, box
        assert area.evaluate("e => e.scrollHeight > e.clientHeight")
        assert page.evaluate("document.documentElement.scrollHeight") < 4000
        screenshot(page, "service-events")

        # Older pages, read with the cursor until there are none.
        older = page.get_by_role("button", name="Show older events")
        shown = PAGE
        while shown < len(events):
            older.click()
            shown = min(shown + PAGE, len(events))
            expect(rows).to_have_count(shown)
        expect(count).to_have_text(f"All {len(events)} events on record, newest first.")
        expect(older).to_be_hidden()
        assert rows.evaluate_all("rs => rs.map(r => r.dataset.eventId)") == newest
        expect(page.locator('#events tr[data-kind="service.created"]')).to_have_count(1)

        # The rollout form, filled from the serving specification.
        context = page.get_by_label("Engine context (tokens)")
        concurrency = page.get_by_label("Concurrency (requests per replica)")
        replicas = page.get_by_label("Number of replicas")
        cpus = page.get_by_label("CPUs per replica")
        memory = page.get_by_label("Memory per replica (MiB)")
        expect(context).to_have_value("512")
        expect(concurrency).to_have_value("2")
        expect(replicas).to_have_value("1")
        expect(cpus).to_have_value("0.5")
        expect(memory).to_have_value("256")
        preview = page.get_by_role("button", name="Preview")
        roll_out = page.get_by_role("button", name="Roll out")

        # A refusal is shown at its field; editing the field clears it.
        context.fill("0")
        with watch.provoking(400, r"/rollout/preview$"):
            preview.click()
            error = page.locator("#rollout-context-error")
            expect(error).to_contain_text("must be from 1 to")
        expect(context).to_have_attribute("aria-invalid", "true")
        expect(page.locator("#rollout-problem")).to_contain_text("see the field above")
        expect(roll_out).to_be_disabled()
        # A replica count the form cannot send is said without asking the server.
        replicas.fill("0")
        preview.click()
        expect(page.locator("#rollout-replicas-error")).to_have_text(
            "Give a whole number from 1 to 64."
        )
        replicas.fill("1")

        # The context changed: the preview says what changes.
        context.fill("1024")
        expect(context).not_to_have_attribute("aria-invalid", "true")
        preview.click()
        changes = page.locator("#rollout-changes")
        expect(changes).to_contain_text("Engine context: 512 tokens → 1024 tokens")
        expect(page.locator("#rollout-verdict")).to_be_visible()
        # A limit left empty is refused by the server at its field.
        memory.fill("")
        with watch.provoking(400, r"/rollout/preview$"):
            preview.click()
            expect(page.locator("#rollout-memory-error")).not_to_be_empty()
        expect(memory).to_have_attribute("aria-invalid", "true")
        expect(page.locator("#rollout-result")).to_be_empty()

        # The advanced JSON says what the fields would send; edited, it fills them back.
        page.get_by_text("Advanced: edit the specification as JSON").click()
        editor = page.get_by_label("Next specification (JSON)")
        expect(editor).to_have_value(re.compile(r'"context": 1024'))
        spec = json.loads(editor.input_value())
        assert spec["context"] == 1024
        assert "memory_bytes" not in spec["placements"][0]["limits"]
        spec["placements"][0]["limits"] = {"cpus": 0.5, "memory_bytes": 300 * MIB}
        editor.fill(json.dumps(spec, indent=2))
        page.get_by_text("Advanced: edit the specification as JSON").click()
        expect(memory).to_have_value("300")
        expect(cpus).to_have_value("0.5")

        # Another strategy, previewed: the server's words for it, with its downtime.
        strategy = page.get_by_label("Strategy")
        strategy.select_option("recreate")
        preview.click()
        expect(page.locator("#rollout-verdict")).to_have_text(
            "The next generation can be rolled out in place, every replica at once. "
            "The service is down meanwhile."
        )
        expect(page.locator("#rollout-how")).to_contain_text("no replica serves until it is ready")
        expect(page.locator("#rollout-result caption")).to_have_text(
            ["In place of the serving generation (after the cut-over)"]
        )
        strategy.select_option("auto")
        expect(roll_out).to_be_disabled()

        # Previewed, then rolled out: what it previewed becomes the next generation.
        preview.click()
        expect(page.locator("#rollout-verdict")).to_have_text(
            "The next generation fits beside the serving one: it can be rolled out."
        )
        expect(changes).to_contain_text(
            "Replica 0: on local: 0.5 CPU, 256 MiB → on local: 0.5 CPU, 300 MiB"
        )
        expect(roll_out).to_be_enabled()
        # A change after the preview needs another preview.
        concurrency.fill("1")
        expect(roll_out).to_be_disabled()
        concurrency.fill("2")
        expect(roll_out).to_be_enabled()
        screenshot(page, "service-rollout")
        _rolled_out(page, watch, generation + 1)
        expect(page.locator("#spec")).to_contain_text("1024 tokens")
        expect(page.locator("#spec")).to_contain_text("on local: 0.5 CPU, 300 MiB")
        # The form follows the new generation.
        expect(context).to_have_value("1024")
        expect(memory).to_have_value("300")

        # Two replicas, then back to one: a scale-down, which needs no room.
        replicas.fill("2")
        preview.click()
        expect(changes).to_contain_text("Replicas: 1 → 2")
        expect(changes).to_contain_text("Replica 1 (new): on local: 0.5 CPU, 300 MiB")
        _rolled_out(page, watch, generation + 2)
        expect(replicas).to_have_value("2")
        replicas.fill("1")
        preview.click()
        expect(page.locator("#rollout-verdict")).to_have_text(
            "A scale-down: it needs no room and is applied at once."
        )
        expect(changes).to_contain_text("Replica 1 on local: removed")
        _act(
            page,
            watch,
            "Roll out",
            "Roll out smol",
            "Scale smol down to 1 replica(s)? The replicas past 1 drain and stop.",
            re.compile(r"^smol changed: scale-down from 2 to 1 replica"),
        )
        expect(page.locator("#spec")).not_to_contain_text("Replica 1")
        expect(replicas).to_have_value("1")
        assert fits_width(page)
        watch.check()


@pytest.mark.deadline(310)
async def test_a_service_page_bounds_its_events_reads_its_log_and_rolls_out_from_a_form(
    tmp_path,
):
    chromium_or_skip()
    engine, settings = standin_engine(tmp_path)
    with trio.fail_after(300):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), console_refresh=0.5
        ) as controller:
            service_id = await _tiny_service(controller, tmp_path, engine)
            # Started and stopped a few times: more events than one page, five attempts.
            for _ in range(4):
                await _cycle(controller, service_id, "start", _ready)
                await _cycle(controller, service_id, "stop", _stopped)
            await _cycle(controller, service_id, "start", _ready)
            generation = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))[
                "generation"
            ]
            found = await controller.ok(
                "GET", f"/api/v1/inference/{service_id}/events", params={"limit": 500}
            )
            events = found["events"]
            assert len(events) > 2 * PAGE
            await trio.to_thread.run_sync(
                _panes, controller.url, service_id, events, generation, abandon_on_cancel=True
            )


def _no_lines(url: str, service_id: str) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = open_page(browser, url)
        log_in(page, *ALICE, "default")
        leave_dashboard(page, f"/ui/services/{service_id}")
        log = page.get_by_label("Engine log")
        expect(page.locator("#log-status")).to_have_text(
            re.compile(r"^Replica 0's attempt \d+ \(loading\) has written no line yet\.")
        )
        expect(log).to_have_class(re.compile(r"\bno-lines\b"))
        said = log.evaluate("e => getComputedStyle(e, '::before').content")
        assert said == '"No lines yet."', said
        watch.check()


@pytest.mark.deadline(130)
async def test_a_log_that_has_no_line_says_so_and_only_then(tmp_path):
    """An engine that writes nothing (it never gets ready): the page reads its log at once
    and says "No lines yet." because there is none."""
    chromium_or_skip()
    engine = tmp_path / "silent-llama-server"
    engine.write_text("#!/bin/sh\nexec sleep 300\n")
    engine.chmod(0o755)
    settings = write_agent_settings(tmp_path, engine)
    with trio.fail_after(120):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), console_refresh=0.5
        ) as controller:
            service_id = await _tiny_service(controller, tmp_path, engine)
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_status(
                service_id, lambda status: status["replicas"][0]["state"] == "loading"
            )
            await trio.to_thread.run_sync(
                _no_lines, controller.url, service_id, abandon_on_cancel=True
            )
