"""The web console end to end in a real browser (Debian's chromium through Playwright)
against a real controller with the real llama.cpp engine: landing and login, the live
dashboard, logout, CSRF, and one project's session never seeing another's service.

Every page fails its test on a console error, an uncaught exception, a failed request
or a response of 400 or more that the test did not provoke (``PageWatch``). With
``FICC_SCREENSHOTS=docs/ui`` the tests also save the screenshots of docs/ui.md
(``make screenshots``).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import httpx
import pytest
import trio

from ficc_core.auth import ALL_SCOPES

from ..conftest import bearer, issue_token
from ..support.inference_support import (
    Controller,
    llama_spec,
    open_inference_controller,
    register_smollm2,
)
from ..support.web_support import STEP_MS, PageWatch, chromium, chromium_or_skip, screenshot

pytestmark = pytest.mark.slow

CONTACT = "ops@example.org"
NOTICE = "Maintenance window: Fridays 18:00-19:00 UTC."
ALICE = ("alice", "alice-password-1")  # a member of project default
BOB = ("bob", "bob-password-1")  # a member of project beta only
MEMBER_SCOPES = sorted(set(ALL_SCOPES) - {"admin"})
#: How long a SmolLM2 replica may take from start to ready.
READY_MS = 120_000


@attrs.frozen
class Console:
    controller: Controller
    url: str
    service_id: str  # project default's service "smol"
    other_id: str  # project beta's service "other", on demand (scaling min 0)
    beta_token: str  # an all-scopes credential of project beta


async def _create_user(controller: Controller, name: str, password: str, project: str, scopes):
    await controller.ok(
        "POST",
        "/api/v1/users",
        status=201,
        json={"username": name, "password": password, "projects": {project: scopes}},
    )


@asynccontextmanager
async def open_console(tmp_path) -> AsyncIterator[Console]:
    """A real controller (embedded node, llama.cpp runtime) with the console settings, two
    projects, a member of each and a stopped SmolLM2 service in each, made through the API."""
    async with open_inference_controller(
        tmp_path, landing_contact=CONTACT, landing_notice=NOTICE, console_refresh=0.5
    ) as controller:
        await controller.ok("POST", "/api/v1/projects", status=201, json={"name": "beta"})
        await _create_user(controller, *ALICE, "default", MEMBER_SCOPES)
        await _create_user(
            controller, *BOB, "beta", ["contributors:read", "inference:read", "models:read"]
        )
        model_id = await register_smollm2(controller)
        spec = await llama_spec(controller, model_id, alias="smol", cpus=0.5)
        created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
        beta = Controller(
            controller.service,
            controller.url,
            await issue_token(controller.service, project="beta", name="beta-operator"),
            controller.http,
        )
        # The same file in another project: its content is verified already, shared.
        manifest = (await controller.ok("GET", f"/api/v1/models/{model_id}"))["manifest"]
        beta_model = (await beta.ok("POST", "/api/v1/models", status=201, json=manifest))["id"]
        assert (await beta.ok("GET", f"/api/v1/models/{beta_model}"))["state"] == "verified"
        beta_spec = await llama_spec(beta, beta_model, alias="other", cpus=0.5)
        beta_spec["scaling"] = {"min": 0, "max": 1}
        other = await beta.ok("POST", "/api/v1/inference", status=201, json=beta_spec)
        yield Console(controller, controller.url, created["id"], other["id"], beta.token)


async def in_browser(scenario, *args) -> None:
    """Run ``scenario(*args)`` (synchronous Playwright code) in a worker thread while the
    controller keeps serving; every browser step is bounded by Playwright's timeouts."""
    with trio.fail_after(300):
        await trio.to_thread.run_sync(scenario, *args, abandon_on_cancel=True)


def _page(browser, url: str, width: int = 1280, height: int = 900):
    context = browser.new_context(base_url=url, viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(STEP_MS)
    return page, PageWatch(page)


def _start(url: str, token: str, service_id: str) -> None:
    """Start a service through the API, as another client would."""
    with httpx.Client(base_url=url, headers=bearer(token), timeout=30) as http:
        view = http.get(f"/api/v1/inference/{service_id}").json()
        started = http.post(
            f"/api/v1/inference/{service_id}/control/start", json={"revision": view["revision"]}
        )
        assert started.status_code == 200, started.text


def _log_in(page, username: str, password: str, project: str) -> None:
    page.goto("/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_label("Project").fill(project)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/ui/dashboard")


def _tab_to(page, selector: str, presses: int = 15) -> None:
    """Press Tab until the element ``selector`` has the focus (at most ``presses`` times)."""
    for _ in range(presses):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"{selector} never took the focus by keyboard")


def _fits_width(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def _login_dashboard_and_logout(console: Console) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = _page(browser, console.url)

        # The landing page: the operator's contact and notice, the login form.
        page.goto("/")
        expect(page.get_by_role("heading", name="Self-hosted language models")).to_be_visible()
        expect(page.locator("#contact")).to_have_attribute("href", f"mailto:{CONTACT}")
        expect(page.get_by_role("note")).to_have_text(NOTICE)
        assert _fits_width(page)
        screenshot(page, "landing")

        # A wrong password is said on the page, and the form stays.
        page.get_by_label("Username").fill(ALICE[0])
        page.get_by_label("Password").fill("not-the-password")
        with watch.provoking(401, r"/api/v1/session$"):
            page.get_by_role("button", name="Log in").click()
            expect(page.get_by_role("alert")).to_have_text("the username or password is wrong")
        expect(page.get_by_label("Password")).to_be_focused()

        # Logging in by keyboard alone: Tab to each field, Enter submits.
        page.goto("/")
        _tab_to(page, "#username")
        page.keyboard.type(ALICE[0])
        page.keyboard.press("Tab")
        page.keyboard.type(ALICE[1])
        page.keyboard.press("Tab")
        expect(page.get_by_label("Project")).to_be_focused()
        page.keyboard.press("Control+A")
        page.keyboard.type("default")
        page.keyboard.press("Enter")
        page.wait_for_url("**/ui/dashboard")
        assert page.evaluate("sessionStorage.getItem('ficc.csrf')")

        # The dashboard: the node, the service (stopped), the model, the events.
        expect(page.locator("#whoami")).to_have_text("alice · default")
        node = page.locator('#nodes tr[data-node-id="local"]')
        expect(node.locator("td.state")).to_have_text("connected")
        expect(node).to_contain_text("llama_server (process)")
        expect(node).to_contain_text("ficc/embedded=true")
        # Reserved of the node's: smol holds half a CPU and 1 GiB (beta's on-demand
        # service, stopped, holds nothing).
        expect(node.locator("td").nth(1)).to_have_text("0.5 of 2")
        expect(node.locator("td").nth(2)).to_contain_text("1 GiB of ")
        row = page.locator(f'#services tr[data-service-id="{console.service_id}"]')
        expect(row.locator("th")).to_contain_text("smol")
        expect(row.locator("td.state .badge")).to_have_text("stopped")
        expect(row.locator("td.replicas")).to_have_text("1 stopped (of 1)")
        expect(page.locator("#models tbody tr")).to_have_count(1)
        expect(page.locator("#models td.progress")).to_contain_text("100% verified")
        expect(page.locator("#events")).to_contain_text("service.created")
        expect(page.locator(f'#services tr[data-service-id="{console.other_id}"]')).to_have_count(0)

        # Started through the API, the row changes in place: no reload.
        page.evaluate("window.__sameDocument = true")
        _start(console.url, console.controller.token, console.service_id)
        expect(row.locator("td.state .badge")).to_have_text("ready", timeout=READY_MS)
        expect(row.locator("td.replicas")).to_have_text("1 ready (of 1)")
        expect(page.locator("#events")).to_contain_text("service.state")
        assert page.evaluate("window.__sameDocument") is True
        screenshot(page, "dashboard")

        # At phone width nothing overflows the page (tables scroll inside their region).
        page.set_viewport_size({"width": 390, "height": 844})
        expect(row.locator("td.state .badge")).to_have_text("ready")
        assert _fits_width(page)
        screenshot(page, "dashboard-phone")
        page.set_viewport_size({"width": 1280, "height": 900})

        # Logging out by keyboard: back at the login form, and the dashboard is closed.
        _tab_to(page, "#logout")
        page.keyboard.press("Enter")
        page.wait_for_url(re.compile(r"/$"))
        expect(page.get_by_role("button", name="Log in")).to_be_visible()
        assert page.evaluate("sessionStorage.getItem('ficc.csrf')") is None
        page.goto("/ui/dashboard")
        assert page.url == console.url + "/"
        watch.check()


@pytest.mark.deadline(600)
async def test_log_in_watch_the_dashboard_change_live_and_log_out(tmp_path):
    chromium_or_skip()
    async with open_console(tmp_path) as console:
        await in_browser(_login_dashboard_and_logout, console)


_POST_TOKEN = """async (csrf) => {
  const headers = {"Content-Type": "application/json"};
  if (csrf) headers["X-CSRF-Token"] = csrf;
  const response = await fetch("/api/v1/tokens", {
    method: "POST", headers, body: JSON.stringify({name: "from-page", scopes: ["inference:read"]}),
  });
  const body = await response.json();
  return [response.status, response.ok ? body.credential.name : body.error.code];
}"""

_GET_STATUS = """async (path) => {
  const response = await fetch(path);
  const body = await response.json();
  return [response.status, response.ok ? null : body.error.code];
}"""


def _csrf_and_projects(console: Console) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = _page(browser, console.url)
        _log_in(page, *ALICE, "default")
        mine = page.locator(f'#services tr[data-service-id="{console.service_id}"]')
        expect(mine).to_be_visible()
        # From the page's own context: an unsafe request without the token is refused...
        with watch.provoking(403, r"/api/v1/tokens$"):
            assert page.evaluate(_POST_TOKEN, None) == [403, "csrf_failed"]
            assert page.evaluate(_POST_TOKEN, "not-the-token") == [403, "csrf_failed"]
        # ...and the same request with the token the login answered is not.
        csrf = page.evaluate("sessionStorage.getItem('ficc.csrf')")
        assert page.evaluate(_POST_TOKEN, csrf) == [201, "from-page"]
        watch.check()

        # A session of project beta sees beta's service and node, never default's service.
        page, watch = _page(browser, console.url, width=390, height=844)
        _log_in(page, *BOB, "beta")
        expect(page.locator("#whoami")).to_have_text("bob · beta")
        other = page.locator(f'#services tr[data-service-id="{console.other_id}"]')
        expect(other.locator("th")).to_contain_text("other")
        expect(other.locator("td.state .badge")).to_have_text("stopped")
        expect(other.locator("td.scaling")).to_have_text("0 running, min 0, max 1")
        expect(page.locator("#services tbody tr")).to_have_count(1)
        expect(page.locator('#nodes tr[data-node-id="local"]')).to_be_visible()
        expect(page.locator("#events")).to_contain_text("service other created")
        expect(page.locator("#events")).not_to_contain_text("service smol")
        expect(page.locator('#services tr[data-alias="smol"]')).to_have_count(0)
        assert console.service_id not in page.locator("main").inner_text()
        # Bob holds no tokens:manage: the dashboard asks for nothing it may not read.
        path = f"/api/v1/inference/{console.service_id}"
        with watch.provoking(404, re.escape(path) + "$"):
            assert page.evaluate(_GET_STATUS, path) == [404, "service_not_found"]
        # Started on demand, it waits idle for its first request: said live, with why.
        _start(console.url, console.beta_token, console.other_id)
        expect(other.locator("td.state .badge")).to_have_text("idle")
        expect(other.locator("td.state")).to_contain_text("next request wakes it")
        assert _fits_width(page)
        screenshot(page, "dashboard-beta-phone")
        watch.check()


@pytest.mark.deadline(600)
async def test_csrf_is_required_from_the_page_and_a_project_sees_only_its_own(tmp_path):
    chromium_or_skip()
    async with open_console(tmp_path) as console:
        await in_browser(_csrf_and_projects, console)


CAROL = ("carol", "carol-password-1")  # a member of project beta who may not read nodes


def _few_scopes_then_ended(console: Console, carol_id: str) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = _page(browser, console.url)
        _log_in(page, *CAROL, "beta")
        # Sections whose routes need a scope the session lacks say so, and are not asked.
        nodes = page.locator('.note[data-for="nodes"]')
        expect(nodes).to_have_text(
            "This session lacks the contributors:read scope that listing nodes needs."
        )
        expect(page.locator("#nodes")).to_be_hidden()
        expect(page.locator("#models tbody tr")).to_have_count(1)
        expect(page.locator(f'#services tr[data-service-id="{console.other_id}"]')).to_be_visible()
        refreshes = int(page.locator("body").get_attribute("data-refreshes"))
        expect(page.locator("body")).not_to_have_attribute("data-refreshes", str(refreshes))
        # A session ended elsewhere (an administrator resets the password): the next
        # refresh finds it gone and, its requests answered (none is left in flight to
        # fail), the page goes back to the login form by itself.
        with watch.provoking(401, r"/api/v1/"):
            with httpx.Client(
                base_url=console.url, headers=bearer(console.controller.token), timeout=30
            ) as http:
                reset = http.put(
                    f"/api/v1/users/{carol_id}/password", json={"password": "carol-password-2"}
                )
                assert reset.status_code == 200, reset.text
                assert reset.json()["sessions_ended"] == 1
            page.wait_for_url(re.compile(r"/$"))
        expect(page.get_by_role("button", name="Log in")).to_be_visible()
        watch.check()


@pytest.mark.deadline(600)
async def test_a_session_sees_what_its_scopes_allow_and_leaves_when_ended_elsewhere(tmp_path):
    chromium_or_skip()
    async with open_console(tmp_path) as console:
        carol = await console.controller.ok(
            "POST",
            "/api/v1/users",
            status=201,
            json={
                "username": CAROL[0],
                "password": CAROL[1],
                "projects": {"beta": ["inference:read", "models:read"]},
            },
        )
        await in_browser(_few_scopes_then_ended, console, carol["id"])


GIB = 1024**3
_ROW = """async ([url, kind, view]) => {
  const tables = await import(url);
  const row = kind === "node" ? tables.nodeRow(view) : tables.serviceRow(view, new Map());
  return [...row.cells].map((cell) => cell.textContent);
}"""


def test_a_node_row_adds_up_each_gpus_reserved_memory_and_a_service_row_its_scaling(
    live_server,
):
    """The dashboard's rows from API views this machine cannot produce (a node with
    GPUs, a pinned scaled service), rendered by the page's own module in the browser."""
    from ficc_core.web import Assets

    gpu = {"name": "NVIDIA H200", "memory_bytes": 140 * GIB}
    node = {
        "id": "gpu-1",
        "name": "gpu-1",
        "state": "connected",
        "labels": {"zone": "a"},
        "last_heartbeat": None,
        "snapshot": {
            "labels": {},
            "resources": {
                "cpus": 16,
                "memory_bytes": 64 * GIB,
                "gpus": [{"index": 0, **gpu}, {"index": 1, **gpu}],
            },
            "runtimes": [],
        },
        "reservations": [
            {"cpus": 4, "memory_bytes": 16 * GIB, "gpus": [{"index": 0, "memory_bytes": 40 * GIB}]},
            {
                "cpus": 2.5,
                "memory_bytes": 8 * GIB,
                "gpus": [
                    {"index": 0, "memory_bytes": 60 * GIB},
                    {"index": 1, "memory_bytes": 20 * GIB},
                ],
            },
        ],
    }
    service = {
        "id": "svc_1",
        "alias": "qwen",
        "model_id": "m1",
        "state": "ready",
        "desired": "running",
        "reason": None,
        "revision": 4,
        "generation": 2,
        "replicas": [{"state": "ready"}, {"state": "ready"}, {"state": "stopped"}],
        "scaling": {"min": 1, "max": 3, "idle_timeout": 600, "pinned": True, "running": 2},
    }
    url = Assets.load().url("js/tables.js")
    with chromium(chromium_or_skip()) as browser:
        page, watch = _page(browser, live_server.url)
        page.goto("/")
        cells = page.evaluate(_ROW, [url, "node", node])
        assert cells[2:5] == [
            "6.5 of 16",
            "24 GiB of 64 GiB",
            "GPU 0 NVIDIA H200: 100 GiB reserved, 40 GiB free of 140 GiB"
            "GPU 1 NVIDIA H200: 20 GiB reserved, 120 GiB free of 140 GiB",
        ]
        assert cells[5] == "zone=a" and cells[6] == "\u2013" and cells[7] == "never"
        cells = page.evaluate(_ROW, [url, "service", service])
        assert cells[1:4] == [
            "ready",
            "2 ready · 1 stopped (of 3)",
            "2 running, min 1, max 3; idle after 600 s pinned",
        ]
        watch.check()
