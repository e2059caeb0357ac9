"""The console's keys, usage and administration pages end to end in a real browser
(Debian's chromium through Playwright) against a real controller: a service key made
on the keys page is shown once, invokes the real llama.cpp engine until it is revoked
there, and its request is on the usage page beside the limits set; an administrator
approves a pending signup from the administration page and that person can then log
in; a member's session is offered no administration page, and its routes refuse it.

Every page fails its test on a console error, an uncaught exception, a failed request
or a response of 400 or more that the test did not provoke (``PageWatch``). With
``FICC_SCREENSHOTS=docs/ui`` the tests save the screenshots of docs/ui.md.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest
import trio

from ..conftest import bearer
from ..support.inference_support import llama_spec, open_inference_controller, register_smollm2
from ..support.web_support import (
    ALICE,
    MEMBER_SCOPES,
    add_alice,
    chromium,
    chromium_or_skip,
    fits_width,
    leave_dashboard,
    log_in,
    open_page,
    screenshot,
)

pytestmark = pytest.mark.slow

ROOT = ("root", "root-password-1")  # an administrator
DAVE = ("dave", "dave-password-1")  # signs up, pending until approved
#: How long a SmolLM2 replica may take from start to ready, in seconds.
READY_S = 120


async def in_browser(scenario, *args) -> None:
    """Run ``scenario(*args)`` (synchronous Playwright code) in a worker thread while the
    controller keeps serving; every browser step is bounded by Playwright's timeouts."""
    with trio.fail_after(300):
        await trio.to_thread.run_sync(scenario, *args, abandon_on_cancel=True)


def _chat(url: str, service_id: str, token: str) -> httpx.Response:
    """One chat completion on the service, as an application holding ``token`` would."""
    with httpx.Client(base_url=url, headers=bearer(token), timeout=120) as http:
        return http.post(
            f"/api/v1/inference/{service_id}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4},
        )


def _keys_and_usage(url: str, service_id: str) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = open_page(browser, url)
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
        log_in(page, *ALICE, "default")
        nav = page.get_by_role("navigation", name="Console")
        expect(nav.get_by_role("link", name="Keys")).to_have_attribute("href", "/ui/keys")
        leave_dashboard(page, "/ui/keys")
        expect(page.get_by_role("link", name="Administration")).to_have_count(0)

        # A service key: made on the page, shown once, its lifetime bounded by the session.
        form = page.locator("#service-key-form")
        form.get_by_label("Service").select_option(service_id)
        expect(page.locator('.note[data-for="service-keys"]')).to_have_text(
            "Service smol has no key yet."
        )
        form.get_by_label("Name", exact=True).fill("app-key")
        form.get_by_label("Lifetime").select_option(label="1 day")
        form.get_by_role("button", name="Create service key").click()
        issued = page.locator("#issued")
        expect(issued).to_be_visible()
        expect(issued).to_be_focused()
        token = page.get_by_label("New key").input_value()
        assert token.startswith("ficc_"), token
        expect(page.locator("#issued-what")).to_contain_text('A key of service smol "app-key"')
        expect(page.locator("#issued-capped")).to_contain_text("this browser session ends sooner")
        row = page.locator('#service-keys tr[data-key-name="app-key"]')
        expect(row.locator("td.state")).to_have_text("active")
        # The copy button puts it on the clipboard.
        page.get_by_role("button", name="Copy").click()
        expect(page.locator("#issued-copied")).to_have_text("Copied to the clipboard.")
        assert page.evaluate("navigator.clipboard.readText()") == token
        screenshot(page, "keys")

        # The key works, as an application would use it, against the real engine.
        answered = _chat(url, service_id, token)
        assert answered.status_code == 200, answered.text
        assert answered.json()["choices"][0]["message"]["content"] is not None

        # Shown once: hidden on request, and a reload never shows it again.
        page.get_by_role("button", name="I have copied it: hide it").click()
        expect(issued).to_be_hidden()
        assert page.get_by_label("New key").input_value() == ""
        page.reload()
        expect(row.locator("td.state")).to_have_text("active")
        expect(issued).to_be_hidden()
        assert token not in page.content()
        assert token.split(".", 1)[1] not in page.content()

        # Revoked from the page (after a confirmation), it stops working at once.
        row.get_by_role("button", name="Revoke app-key").click()
        dialog = page.get_by_role("dialog", name="Revoke this key?")
        expect(dialog).to_contain_text('Key "app-key" of service smol stops working at once')
        expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
        page.keyboard.press("Escape")  # kept: the dialog closes, the key stays
        expect(dialog).to_be_hidden()
        expect(row.locator("td.state")).to_have_text("active")
        row.get_by_role("button", name="Revoke app-key").click()
        dialog.get_by_role("button", name="Revoke", exact=True).click()
        expect(page.get_by_role("status")).to_have_text('Key "app-key" is revoked.')
        expect(row.locator("td.state")).to_have_text("revoked")
        expect(row.get_by_role("button")).to_have_count(0)
        refused = _chat(url, service_id, token)
        assert refused.status_code == 401, refused.text

        # A personal key: made, shown once, listed, revoked.
        personal = page.locator("#personal-key-form")
        personal.get_by_label("Name", exact=True).fill("laptop")
        personal.get_by_role("button", name="Create personal key").click()
        expect(page.locator("#issued-what")).to_contain_text('Your personal key "laptop"')
        assert page.get_by_label("New key").input_value().startswith("ficc_")
        mine = page.locator('#personal-keys tr[data-key-name="laptop"]')
        expect(mine.locator("td.state")).to_have_text("active")
        mine.get_by_role("button", name="Revoke laptop").click()
        dialog.get_by_role("button", name="Revoke", exact=True).click()
        expect(mine.locator("td.state")).to_have_text("revoked")
        expect(issued).to_be_hidden()  # the key it showed is revoked: shown no longer

        # At phone width nothing overflows; the form and the tables stack.
        page.set_viewport_size({"width": 390, "height": 844})
        assert fits_width(page)
        screenshot(page, "keys-phone")
        page.set_viewport_size({"width": 1280, "height": 900})

        # The usage page: the request made with the key, per key and per service.
        page.get_by_role("link", name="Usage").click()
        page.wait_for_url("**/ui/usage")
        expect(page.get_by_label("Period")).to_have_value("day")
        expect(page.get_by_label("Group by")).to_have_value("key")
        used = page.locator('#groups tr[data-group-name="app-key"]')
        expect(used.locator("td.requests")).to_have_text("1")
        expect(used.locator("td.errors")).to_have_text("0")
        expect(page.locator('[data-figure="requests"] .amount')).to_have_text("1")
        # The limits set on a key of the project, with its use.
        limited = page.locator('#limits tr[data-scope="credential"]')
        expect(limited.locator("th")).to_contain_text("Key batch-job")
        expect(limited.locator("td").nth(0)).to_contain_text("0 of 30")
        expect(limited.locator("td").nth(2)).to_contain_text("0.000 of 5 units today (UTC)")
        expect(page.locator('.note[data-for="limits"]')).to_contain_text(
            "shown to administrators only"
        )
        screenshot(page, "usage")
        page.get_by_label("Group by").select_option("service")
        by_service = page.locator(f'#groups tr[data-group-id="{service_id}"]')
        expect(by_service.locator("th")).to_contain_text("smol")
        expect(by_service.locator("td.requests")).to_have_text("1")
        assert "by=service" in page.url
        # The choice is in the address: a reload keeps it.
        page.reload()
        expect(page.get_by_label("Group by")).to_have_value("service")
        expect(by_service.locator("td.requests")).to_have_text("1")
        groups_title = page.locator("#groups-title")
        expect(groups_title).to_have_text("Per service")
        # Totals only: the section says it is not grouped, and why it has no rows.
        page.get_by_label("Group by").select_option("")
        expect(groups_title).to_have_text("Not grouped")
        expect(page.locator('.note[data-for="groups"]')).to_have_text(
            "Choose what to group by to see the totals split."
        )
        page.get_by_label("Group by").select_option("service")
        expect(by_service.locator("td.requests")).to_have_text("1")
        # Personal usage: no personal key made a request.
        page.get_by_label("Whose").select_option("me")
        expect(page.get_by_label("Service", exact=True)).to_be_hidden()
        expect(page.locator('[data-figure="requests"] .amount')).to_have_text("0")
        page.set_viewport_size({"width": 390, "height": 844})
        page.get_by_label("Whose").select_option("project")
        expect(by_service.locator("td.requests")).to_have_text("1")
        assert fits_width(page)
        screenshot(page, "usage-phone")
        watch.check()


@pytest.mark.deadline(130)
async def test_a_service_key_is_shown_once_works_until_revoked_and_its_use_is_on_the_usage_page(
    tmp_path,
):
    chromium_or_skip()
    async with open_inference_controller(tmp_path, console_refresh=60) as controller:
        await add_alice(controller)
        model_id = await register_smollm2(controller)
        spec = await llama_spec(controller, model_id, alias="smol", cpus=0.5)
        service_id = (await controller.ok("POST", "/api/v1/inference", status=201, json=spec))["id"]
        started = await controller.control(service_id, "start")
        assert started.status_code == 200, started.text
        # A key of the project with limits of its own, for the usage page's limits.
        batch = await controller.ok(
            "POST",
            "/api/v1/tokens",
            status=201,
            json={"name": "batch-job", "scopes": ["inference:invoke"]},
        )
        await controller.ok(
            "PUT",
            f"/api/v1/tokens/{batch['credential']['id']}/limits",
            json={"rpm": 30, "budget": 5, "period": "day"},
        )
        with trio.fail_after(READY_S):
            await controller.wait_service(service_id, lambda v: v["state"] == "ready", 0.2)
        await in_browser(_keys_and_usage, controller.url, service_id)


_GET = """async (path) => {
  const response = await fetch(path);
  const body = await response.json();
  return [response.status, response.ok ? null : body.error.code];
}"""


def _approve_a_signup(url: str) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        # Dave signed up: until approved, his right password is told "pending".
        page, watch = open_page(browser, url)
        page.goto("/")
        page.get_by_label("Username").fill(DAVE[0])
        page.get_by_label("Password").fill(DAVE[1])
        page.get_by_label("Project").fill("")
        with watch.provoking(403, r"/api/v1/session$"):
            page.get_by_role("button", name="Log in").click()
            expect(page.get_by_role("alert")).to_have_text(
                "the account 'dave' is pending an administrator's approval"
            )
        watch.check()

        # An administrator: the navigation offers the administration page.
        admin, admin_watch = open_page(browser, url)
        log_in(admin, *ROOT, "default")
        nav = admin.get_by_role("navigation", name="Console")
        expect(nav.get_by_role("link", name="Administration")).to_have_attribute(
            "href", "/ui/admin"
        )
        leave_dashboard(admin, "/ui/admin")
        waiting = admin.locator('#pending tr[data-username="dave"]')
        expect(waiting).to_be_visible()
        expect(admin.locator('#users tr[data-username="dave"] td.state')).to_have_text("pending")
        expect(admin.locator('#users tr[data-username="alice"] td.state')).to_have_text("active")
        expect(admin.locator('#projects tr[data-project-name="default"]')).to_contain_text("alice")
        screenshot(admin, "admin")
        # Approved from the page: no longer waiting, active.
        waiting.get_by_role("button", name="Approve dave").click()
        expect(admin.get_by_role("status")).to_have_text(
            "dave is approved and can log in; add them to a project under Membership."
        )
        expect(admin.locator('.note[data-for="pending"]')).to_have_text("No signup is waiting.")
        dave_row = admin.locator('#users tr[data-username="dave"]')
        expect(dave_row.locator("td.state")).to_have_text("active")
        # Made a member of project default with two scopes, by keyboard and labels.
        membership = admin.locator("#membership-form")
        expect(membership.get_by_label("User")).to_have_value(
            dave_row.get_attribute("data-user-id")
        )
        membership.get_by_label("Project").select_option(label="default")
        membership.get_by_label("inference:read").check()
        membership.get_by_label("models:read").focus()
        admin.keyboard.press("Space")
        expect(membership.get_by_label("models:read")).to_be_checked()
        membership.get_by_role("button", name="Set scopes").click()
        expect(admin.get_by_role("status")).to_have_text("dave holds 2 scopes in default.")
        expect(dave_row.locator("td.chips")).to_have_text("default: 2 scopes")
        # A refusal names the field the API's error names, and focuses it.
        users_form = admin.locator("#user-form")
        users_form.get_by_label("Username").fill("erin")
        users_form.get_by_label("Password").fill("short")
        with admin_watch.provoking(400, r"/api/v1/users$"):
            users_form.get_by_role("button", name="Create user").click()
            expect(admin.locator("#problem")).to_have_text(
                "Could not create the user: a password needs at least 8 characters "
                "(Password: too short)"
            )
        password = users_form.get_by_label("Password")
        expect(password).to_be_focused()
        expect(password).to_have_attribute("aria-invalid", "true")
        expect(admin.locator('#users tr[data-username="erin"]')).to_have_count(0)
        # A project made from the page.
        admin.get_by_label("Name", exact=True).fill("gamma")
        admin.get_by_role("button", name="Create project").click()
        expect(admin.locator('#projects tr[data-project-name="gamma"]')).to_be_visible()
        admin.set_viewport_size({"width": 390, "height": 844})
        assert fits_width(admin)
        screenshot(admin, "admin-phone")
        admin_watch.check()

        # Dave logs in now, to the project he was added to.
        page, watch = open_page(browser, url)
        log_in(page, *DAVE, "default")
        expect(page.locator("#whoami")).to_have_text("dave · default")
        expect(page.locator("body")).to_have_attribute("data-refreshes", re.compile(r"^\d+$"))
        watch.check()

        # A member's session: no administration link, and the page asks for nothing;
        # the routes it would use refuse the session.
        page, watch = open_page(browser, url)
        log_in(page, *ALICE, "default")
        nav = page.get_by_role("navigation", name="Console")
        expect(nav.get_by_role("link", name="Keys")).to_be_visible()
        expect(nav.get_by_role("link", name="Administration")).to_have_count(0)
        leave_dashboard(page, "/ui/admin")
        expect(page.locator("#not-admin")).to_contain_text("lacks the admin scope")
        expect(page.locator("#users")).to_have_count(0)
        expect(page.locator("body")).to_have_attribute("data-loaded", "true")
        with watch.provoking(403, r"/api/v1/(users|projects)$"):
            assert page.evaluate(_GET, "/api/v1/users") == [403, "missing_scope"]
            assert page.evaluate(_GET, "/api/v1/projects") == [403, "missing_scope"]
        watch.check()

        # A personal session (no project): no service keys to manage, its own keys by
        # keyboard alone (Enter submits), its own usage only.
        page, watch = open_page(browser, url)
        log_in(page, *ALICE, "")
        expect(page.locator("#whoami")).to_have_text(re.compile(r"^alice · "))
        leave_dashboard(page, "/ui/keys")
        expect(page.locator("#whoami")).to_have_text("alice · personal")
        expect(page.locator('.note[data-for="service-keys"]')).to_have_text(
            "A personal session has no project: log in to a project to manage its service keys."
        )
        expect(page.locator("#service-key-form")).to_be_hidden()
        page.locator("#personal-key-form").get_by_label("Name", exact=True).focus()
        page.keyboard.type("notebook")
        page.keyboard.press("Enter")
        expect(page.locator("#issued")).to_be_focused()
        expect(page.locator('#personal-keys tr[data-key-name="notebook"] td.state')).to_have_text(
            "active"
        )
        page.goto("/ui/usage")
        whose = page.get_by_label("Whose")
        expect(whose.locator("option")).to_have_text(["My personal keys"])
        expect(page.locator('[data-figure="requests"] .amount')).to_have_text("0")
        watch.check()


@pytest.mark.deadline(600)
async def test_an_administrator_approves_a_signup_and_a_member_sees_no_administration(tmp_path):
    chromium_or_skip()
    async with open_inference_controller(
        tmp_path, embedded=False, signup_open=True, console_refresh=60
    ) as controller:
        for (name, password), admin, projects in (
            (ROOT, True, {}),
            (ALICE, False, {"default": MEMBER_SCOPES}),
        ):
            await controller.ok(
                "POST",
                "/api/v1/users",
                status=201,
                json={"username": name, "password": password, "admin": admin, "projects": projects},
            )
        signed_up = await controller.http.post(
            "/api/v1/signup", json={"username": DAVE[0], "password": DAVE[1]}
        )
        assert signed_up.status_code == 201, signed_up.text
        assert signed_up.json()["status"] == "pending"
        await in_browser(_approve_a_signup, controller.url)
        dave = next(
            u
            for u in (await controller.ok("GET", "/api/v1/users"))["users"]
            if u["username"] == "dave"
        )
        assert dave["status"] == "active"
        assert sorted(dave["projects"][0]["scopes"]) == ["inference:read", "models:read"]


def _application_keys(url: str) -> str:
    """Alice sees the project's CLI-made key, makes a lasting application key (a taken
    name and a lifetime past the server's longest are refused or capped on the page),
    revokes the CLI-made one and logs out; returns the application key's token."""
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = open_page(browser, url)
        log_in(page, *ALICE, "default")
        leave_dashboard(page, "/ui/keys")
        # Made elsewhere (the command line), listed with its scopes, expiry and last use.
        cli_made = page.locator('#project-keys tr[data-key-name="ci-deploy"]')
        expect(cli_made.locator("td.scopes")).to_have_text("inference:read")
        expect(cli_made.locator("td.state")).to_have_text("active")
        expect(cli_made.locator("td.last-used")).to_have_text("never")
        expect(cli_made.locator("td").nth(3)).to_have_text(re.compile(r"^in \d+ d$"))

        form = page.locator("#project-key-form")
        form.get_by_label("Name", exact=True).fill("dashboard-app")
        expect(form.get_by_label("Lifetime")).to_have_value("2592000")  # 30 days
        form.get_by_label("inference:read").check()
        form.get_by_label("inference:invoke").uncheck()
        expect(form.get_by_label("End it when this session ends")).not_to_be_checked()
        form.get_by_role("button", name="Create application key").click()
        expect(page.locator("#issued-what")).to_contain_text('The application key "dashboard-app"')
        expect(page.locator("#issued-capped")).to_be_hidden()
        token = page.get_by_label("New key").input_value()
        assert token.startswith("ficc_"), token
        made = page.locator('#project-keys tr[data-key-name="dashboard-app"]')
        expect(made.locator("td.scopes")).to_have_text("inference:read")
        expect(made.locator("td").nth(3)).to_have_text("in 30 d")

        # A taken name is refused, and the page says so.
        form.get_by_label("Name", exact=True).fill("dashboard-app")
        with watch.provoking(409, r"/api/v1/tokens$"):
            form.get_by_role("button", name="Create application key").click()
            expect(page.locator("#problem")).to_contain_text(
                "Could not create the key: a credential called 'dashboard-app' exists already"
            )
        # Past token_max_lifetime (60 days here) it is capped, and the page says so.
        form.get_by_label("Name", exact=True).fill("yearly")
        form.get_by_label("Lifetime").select_option(label="1 year")
        form.get_by_role("button", name="Create application key").click()
        expect(page.locator("#issued-what")).to_contain_text('"yearly"')
        expect(page.locator("#issued-capped")).to_have_text(
            "Its lifetime was shortened to 60 d: the server's longest lifetime "
            "(token_max_lifetime) is shorter."
        )

        # Revoked from the console, though made elsewhere.
        cli_made.get_by_role("button", name="Revoke ci-deploy").click()
        page.get_by_role("dialog", name="Revoke this key?").get_by_role(
            "button", name="Revoke", exact=True
        ).click()
        expect(cli_made.locator("td.state")).to_have_text("revoked")
        # At phone width nothing overflows: the scopes and the form wrap.
        page.set_viewport_size({"width": 390, "height": 844})
        assert fits_width(page)
        page.set_viewport_size({"width": 1280, "height": 900})

        page.get_by_role("button", name="Log out").click()
        page.wait_for_url(re.compile(r"/$"))
        watch.check()
    return token


@pytest.mark.deadline(600)
async def test_an_application_key_made_in_the_console_outlives_the_logout(tmp_path):
    chromium_or_skip()
    async with open_inference_controller(
        tmp_path, embedded=False, console_refresh=60, token_max_lifetime="60d"
    ) as controller:
        await add_alice(controller)
        cli_made = await controller.ok(
            "POST",
            "/api/v1/tokens",
            status=201,
            json={"name": "ci-deploy", "scopes": ["inference:read"]},
        )
        token = await trio.to_thread.run_sync(_application_keys, controller.url)
        # Logged out: the application key still works, the revoked one does not.
        mine = await controller.call("GET", "/api/v1/whoami", token=token)
        assert mine.status_code == 200, mine.text
        assert mine.json()["scopes"] == ["inference:read"]
        assert mine.json()["expires_at"] - time.time() > 29 * 86400
        gone = await controller.call("GET", "/api/v1/whoami", token=cli_made["token"])
        assert gone.json()["error"]["code"] == "credential_revoked"
