"""The console's chat playground in a real browser (Debian's chromium through Playwright)
against a real controller with the real llama.cpp engine and SmolLM2: an answer streams
token by token (an idle on-demand service loading first), Stop cancels the engine's
request and frees its slot, a refused request shows the envelope's message, the project
endpoint answers by a model name, and the dashboard counts the requests afterwards.

Every page fails its test on a console error, an uncaught exception, a failed request
or a response of 400 or more that the test did not provoke (``StreamWatch``). With
``FICC_SCREENSHOTS=docs/ui`` the test also saves the screenshots of docs/ui.md
(``make screenshots``).
"""

from __future__ import annotations

import re

import httpx
import pytest
import trio

from ficc_core.testing.executor_kit import exchange

from ..conftest import bearer
from ..support.inference_support import llama_spec, open_inference_controller, register_smollm2
from ..support.web_support import (
    ALICE,
    STEP_MS,
    StreamWatch,
    add_alice,
    chromium,
    chromium_or_skip,
    screenshot,
)

pytestmark = pytest.mark.slow

#: How long an idle SmolLM2 service may take to load and answer its first token.
LOAD_MS = 120_000
LONG = "Write a very long story about a lighthouse keeper and the sea."
TURN = "#conversation li[data-role=assistant]"

# Every mutation of the conversation, as "state:chunks" of the assistant's last turn:
# an answer that streams is seen growing before it ends.
_OBSERVE = """() => {
  window.__seen = [];
  new MutationObserver(() => {
    const turns = document.querySelectorAll("#conversation li[data-role=assistant]");
    const last = turns[turns.length - 1];
    if (last) window.__seen.push(`${last.dataset.state}:${last.dataset.chunks}`);
  }).observe(document.getElementById("conversation"),
             {subtree: true, childList: true, characterData: true, attributes: true});
}"""

_STREAMING = """(min) => {
  const turns = document.querySelectorAll("#conversation li[data-role=assistant]");
  const last = turns[turns.length - 1];
  return !!last && last.dataset.state === "streaming" && Number(last.dataset.chunks) >= min;
}"""


async def _engine_processing(controller, service_id: str) -> int:
    """llama.cpp's ``requests_processing`` summed over the ready replicas (its slots busy)."""
    busy = 0
    for replica in controller.service.live.get(service_id).replicas:
        endpoint = controller.service.contributors.endpoint(replica.node_id)
        status, _, chunks = await exchange(endpoint, replica.fence, "GET", "/metrics")
        assert status == 200
        for line in b"".join(chunks).decode().splitlines():
            if line.startswith("llamacpp:requests_processing "):
                busy += int(float(line.split()[1]))
    return busy


async def _slot_freed(controller, service_id: str) -> None:
    """Wait (at most 5 s) until the gateway holds no request on the service's replica and
    the engine processes none: the stopped stream's slot is free again."""
    gateway = controller.service.gateway
    with trio.fail_after(5):
        while True:
            [replica] = controller.service.live.get(service_id).replicas
            status = await controller.ok("GET", f"/api/v1/inference/{service_id}/status")
            in_flight = sum(r["in_flight"] for r in status["replicas"])
            if (
                gateway.load(replica.fence.attempt_id) == 0
                and in_flight == 0
                and await _engine_processing(controller, service_id) == 0
            ):
                return
            await trio.sleep(0.05)


def _log_in(page) -> None:
    page.goto("/")
    page.get_by_label("Username").fill(ALICE[0])
    page.get_by_label("Password").fill(ALICE[1])
    page.get_by_label("Project").fill("default")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/ui/dashboard")


def _tab_to(page, selector: str, presses: int = 25) -> None:
    for _ in range(presses):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"{selector} never took the focus by keyboard")


def _last_turn(page):
    return page.locator(TURN).last


def _ask(page, text: str, max_tokens: int) -> None:
    page.get_by_label("Max tokens").fill(str(max_tokens))
    page.get_by_label("Message").fill(text)
    page.get_by_role("button", name="Send").click()


def _fits_width(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def _chat(controller, service_id: str) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        context = browser.new_context(
            base_url=controller.url, viewport={"width": 1280, "height": 900}
        )
        page = context.new_page()
        page.set_default_timeout(STEP_MS)
        watch = StreamWatch(page)
        _log_in(page)
        # Left once its first refresh is answered (the next comes in 5 s): a request the
        # browser cancels for the navigation would count as failed.
        expect(page.locator("body")).to_have_attribute("data-refreshes", "1")
        page.get_by_role("link", name="Chat").click()
        page.wait_for_url("**/ui/chat")
        expect(page.locator("#whoami")).to_have_text("alice · default")
        expect(page.locator("#chat-state")).to_have_text("Ready.")

        # The choices: the service by its own route, and the project endpoint's names
        # (its alias and its model's name).
        picker = page.get_by_label("Model")
        expect(picker.locator("option")).to_have_text(
            ["smol (idle)", "smol (/v1)", "smollm2 → smol (/v1)"]
        )
        expect(picker).to_have_value(f"service:{service_id}")
        expect(page.locator("#max-tokens-help")).to_have_text("smol: 512 tokens per request.")
        page.get_by_label("System prompt").fill("You are a terse assistant.")
        page.get_by_label("Temperature").fill("0.2")
        page.get_by_label("Max tokens").fill("48")

        # By keyboard: Tab to the message, Enter sends. The service is idle: the stream
        # opens with the gateway's keepalive comments while it loads ("loading"), then
        # the answer comes chunk by chunk.
        page.evaluate(_OBSERVE)
        _tab_to(page, "#message")
        page.keyboard.type("Write a short poem about the sea.")
        page.keyboard.press("Enter")
        turn = _last_turn(page)
        expect(turn).to_have_attribute("data-state", "done", timeout=LOAD_MS)
        assert turn.get_attribute("data-seen").split() == [
            "waiting",
            "loading",
            "streaming",
            "done",
        ]
        growing = {s for s in page.evaluate("window.__seen") if s.startswith("streaming:")}
        assert len(growing) >= 3, growing  # several chunks appeared before the end
        assert turn.locator(".content").inner_text().strip()
        expect(turn.locator(".meta")).to_contain_text(re.compile(r"first token after [\d.]+ s"))
        expect(turn.locator(".meta")).to_contain_text(re.compile(r"[\d.]+ tokens/s · \d+ tokens$"))
        expect(page.locator("#stats")).to_contain_text("Last answer: first token after")
        expect(page.locator("#message")).to_be_focused()

        # Stop, mid-answer: the request is aborted, the engine's slot frees, and the next
        # request is served at once (the service has one slot).
        _ask(page, LONG, 400)
        turn = _last_turn(page)
        page.wait_for_function(_STREAMING, arg=3)
        with watch.aborting(r"/v1/chat/completions$"):
            with page.expect_event(
                "requestfailed", lambda r: r.url.endswith("/v1/chat/completions")
            ):
                page.get_by_role("button", name="Stop").click()
            expect(turn).to_have_attribute("data-state", "stopped")
        expect(turn.locator(".meta")).to_contain_text(re.compile(r"^stopped · first token after"))
        partial = turn.locator(".content").inner_text()
        assert partial.strip()
        expect(page.get_by_role("button", name="Stop")).to_be_disabled()
        trio.from_thread.run(_slot_freed, controller, service_id)
        _ask(page, "Say hello.", 8)
        turn = _last_turn(page)
        expect(turn).to_have_attribute("data-state", "done", timeout=10_000)
        assert turn.get_attribute("data-seen").split() == ["waiting", "streaming", "done"]
        expect(page.locator("#conversation li")).to_have_count(6)
        screenshot(page, "chat")

        expect(picker.locator("option").first).to_have_text("smol (ready)")
        # A request the gateway refuses (more tokens than the context holds): the
        # envelope's message is shown, and the question goes back into the message box.
        with watch.provoking(400, r"/v1/chat/completions$"):
            _ask(page, "Hello again.", 4000)
            turn = _last_turn(page)
            expect(turn).to_have_attribute("data-state", "failed")
        expect(turn.get_by_role("alert")).to_contain_text(
            "serves 512 tokens per request (its context length)"
        )
        expect(turn.get_by_role("alert")).to_contain_text("(context_length_exceeded)")
        expect(page.get_by_label("Message")).to_have_value("Hello again.")
        expect(page.locator("#conversation li.user.unanswered")).to_have_count(1)

        # The project endpoint, by the model's name: the service that answered is named.
        picker.select_option("model:smollm2")
        _ask(page, "Say hi.", 8)
        turn = _last_turn(page)
        expect(turn).to_have_attribute("data-state", "done")
        expect(turn.locator(".meta")).to_contain_text("answered by smol · first token after")

        # At phone width nothing overflows the page.
        page.set_viewport_size({"width": 390, "height": 844})
        assert _fits_width(page)
        screenshot(page, "chat-phone")
        page.set_viewport_size({"width": 1280, "height": 900})
        watch.check()

        # The dashboard counts the chat's requests for the service (the last hour), its
        # errors by code and the time to first token.
        with httpx.Client(base_url=controller.url, headers=bearer(controller.token)) as http:
            usage = http.get("/api/v1/usage", params={"period": "1h", "group_by": "service"})
            recent = http.get(f"/api/v1/inference/{service_id}/usage").json()["recent"]
        # The stopped request is recorded as cancelled, not as an error.
        assert sorted(r["outcome"] for r in recent) == [
            "cancelled",
            "context_length_exceeded",
            "ok",
            "ok",
            "ok",
        ], recent
        [group] = usage.json()["groups"]
        assert group["requests"] == 5 and group["errors"] == 1, group
        page.get_by_role("link", name="Dashboard").click()
        page.wait_for_url("**/ui/dashboard")
        row = page.locator(f'#services tr[data-service-id="{service_id}"]')
        expect(row.locator("td.requests")).to_contain_text("5 requests")
        expect(row.locator("td.requests")).to_contain_text("0.0014/s")
        expect(row.locator("td.errors")).to_have_text("1context_length_exceeded 1")
        expect(row.locator("td.ttft")).to_have_text(re.compile(r"^\d+ ms / \d+ ms$"))
        screenshot(page, "dashboard-after-chat")
        watch.check()


@pytest.mark.deadline(410)
async def test_the_playground_streams_stops_shows_refusals_and_the_dashboard_counts(tmp_path):
    chromium_or_skip()
    async with open_inference_controller(
        tmp_path, activation_keepalive=0.2, activation_wait=120
    ) as controller:
        await add_alice(controller)
        model_id = await register_smollm2(controller)
        # On demand (it waits idle for its first request) and one slot: a request the
        # engine still held would make the next one wait.
        spec = await llama_spec(controller, model_id, alias="smol", cpus=1, concurrency=1)
        spec["scaling"] = {"min": 0, "max": 1}
        created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
        assert (await controller.control(created["id"], "start")).status_code == 200
        await controller.wait_service(created["id"], lambda v: v["state"] == "idle")
        with trio.fail_after(400):
            await trio.to_thread.run_sync(_chat, controller, created["id"], abandon_on_cancel=True)


_USAGE_CELLS = """async ([url, group]) => {
  const tables = await import(url);
  return tables.serviceUsageCells(group === null ? undefined : group).map((c) => c.textContent);
}"""


def test_the_dashboards_request_figures_from_a_usage_group(live_server):
    """The services table's last hour from made-up usage groups (many requests, errors of
    two codes; none at all), rendered by the page's own module in the browser."""
    from ficc_core.web import Assets

    group = {
        "service": {"id": "svc_1", "name": "qwen"},
        "requests": 7200,
        "errors": 5,
        "errors_by_code": {"rate_limited": 3, "service_saturated": 2},
        "latency": {
            "duration": {"p50": 1.0, "p90": 2.0, "p99": 3.0},
            "ttfb": {"p50": 0.0424, "p90": 0.2, "p99": 1.5},
        },
    }
    url = Assets.load().url("js/tables.js")
    with chromium(chromium_or_skip()) as browser:
        page = browser.new_context(base_url=live_server.url).new_page()
        page.set_default_timeout(STEP_MS)
        watch = StreamWatch(page)
        page.goto("/")
        assert page.evaluate(_USAGE_CELLS, [url, group]) == [
            "2/s7200 requests",
            "5rate_limited 3, service_saturated 2",
            "42 ms / 1500 ms",
        ]
        assert page.evaluate(_USAGE_CELLS, [url, None]) == ["0/s0 requests", "0", "\u2013"]
        refused = {**group, "requests": 1, "errors": 1, "errors_by_code": {"rate_limited": 1}}
        refused["latency"] = {"duration": {"p50": None}, "ttfb": {"p50": None, "p99": None}}
        assert page.evaluate(_USAGE_CELLS, [url, refused]) == [
            "0.00028/s1 request",
            "1rate_limited 1",
            "\u2013",
        ]
        watch.check()
