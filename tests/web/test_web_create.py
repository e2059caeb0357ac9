"""Creating a service from the console's services page in a real browser (Debian's
chromium through Playwright) against a real controller with the real llama.cpp engine
and the SmolLM2 model registered through the API: fill the form, preview (the plan
places it on the local node), create and start it, watch its page say ready live, chat
with it through the API; then a second create with the same alias is refused with 409
``service_exists`` at the alias, and a preview asking for too much memory says why in
its plan while Create stays disabled.

Every page fails its test on a console error, an uncaught exception, a failed request or
a response of 400 or more the test did not provoke (``PageWatch``). With
``FICC_SCREENSHOTS=docs/ui`` the test also saves ``services-create.png``.
"""

from __future__ import annotations

import httpx
import pytest
import trio

from ..conftest import bearer
from ..support.inference_support import open_inference_controller, register_smollm2
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
)

pytestmark = pytest.mark.slow

#: How long a SmolLM2 replica may take from start to ready.
READY_MS = 120_000


def _fill(page, model_id: str, alias: str, context: int, concurrency: int) -> None:
    page.get_by_label("Model", exact=True).select_option(model_id)
    page.get_by_label("Engine").select_option("llama_cpp")
    page.get_by_label("Alias", exact=True).fill(alias)
    page.get_by_label("Replicas", exact=True).fill("1")
    page.get_by_label("Context (tokens)").fill(str(context))
    page.get_by_label("Concurrency").fill(str(concurrency))


def _chat_and_stop(url: str, operator_token: str, service_id: str) -> None:
    """A chat completion through the service's route with a service-bound key, as a
    client would; then the service is stopped (its reservation goes)."""
    with httpx.Client(base_url=url, headers=bearer(operator_token), timeout=60) as http:
        issued = http.post(f"/api/v1/inference/{service_id}/tokens", json={"lifetime": 600})
        assert issued.status_code == 201, issued.text
        answer = http.post(
            f"/api/v1/inference/{service_id}/v1/chat/completions",
            headers=bearer(issued.json()["token"]),
            json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] is not None
        revision = http.get(f"/api/v1/inference/{service_id}").json()["revision"]
        stopped = http.post(
            f"/api/v1/inference/{service_id}/control/stop", json={"revision": revision}
        )
        assert stopped.status_code == 200, stopped.text


def _create_from_the_page(url: str, model_id: str, operator_token: str) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        dashboard, dashboard_watch = open_page(browser, url)
        log_in(dashboard, *ALICE, "default")
        # The services page opens in another tab of the session (the dashboard goes on
        # polling in its own: leaving it would abort what it has in flight).
        page = dashboard.context.new_page()
        page.set_default_timeout(STEP_MS)
        watch = PageWatch(page)
        page.goto("/ui/services")
        expect(page.locator('.note[data-for="services"]')).to_have_text(
            "This project has no service yet."
        )

        # The form: the verified model, the engine the node's runtime serves.
        form = page.locator("#create-form")
        models = page.get_by_label("Model", exact=True).locator("option")
        expect(models).to_have_text([f"smollm2 ({model_id})"])
        expect(page.get_by_label("Engine")).to_have_value("llama_cpp")
        create = page.get_by_role("button", name="Create", exact=True)
        expect(create).to_be_disabled()
        for label in ("Minimum replicas", "Maximum replicas", "Idle timeout (s)"):
            expect(form.get_by_label(label)).to_have_value("")
        # A refusal with a field path is said at its field.
        _fill(page, model_id, "Not an alias!", 512, 2)
        with watch.provoking(400, r"/api/v1/inference/preview$"):
            page.get_by_role("button", name="Preview").click()
            expect(page.locator("#create-alias-error")).to_contain_text("$.alias")
        expect(page.get_by_label("Alias", exact=True)).to_be_focused()
        expect(create).to_be_disabled()
        _fill(page, model_id, "made", 512, 2)
        expect(page.locator("#create-alias-error")).to_be_hidden()

        # A number of replicas the CLI refuses is refused at its field, as typed (never
        # changed into another one), and nothing is previewed.
        previews: list[str] = []
        page.on("request", lambda r: r.url.endswith("/preview") and previews.append(r.url))
        replicas = page.get_by_label("Replicas", exact=True)
        replicas_error = page.locator("#create-replicas-error")
        for typed in ("0", "-3", "2.5", "65"):
            replicas.fill(typed)
            page.get_by_role("button", name="Preview").click()
            expect(replicas_error).to_have_text(
                f"The number of replicas must be a whole number from 1 to 64, not {typed}."
            )
            expect(replicas).to_be_focused()
            expect(replicas).to_have_attribute("aria-invalid", "true")
            expect(replicas).to_have_value(typed)
            expect(page.locator("#create-result")).to_be_empty()
        replicas.fill("")
        page.get_by_role("button", name="Preview").click()
        expect(replicas_error).to_have_text(
            "Give the number of replicas: a whole number from 1 to 64."
        )
        assert previews == []
        replicas.fill("1")
        expect(replicas_error).to_be_hidden()

        # Preview: the completed specification (what was suggested), the plan on the
        # local node, and Create enabled since it fits.
        page.get_by_role("button", name="Preview").click()
        expect(page.locator("#create-verdict")).to_have_text(
            "It fits: Create submits this specification."
        )
        completed = page.locator("#create-completed")
        expect(completed).to_contain_text(
            "llama_cpp (context 512 \N{MULTIPLICATION SIGN} concurrency 2)"
        )
        expect(completed).to_contain_text(f"smollm2 ({model_id})")
        expect(completed).to_contain_text("suggested")
        expect(page.locator("#create-result")).not_to_contain_text("null")
        expect(completed).to_contain_text("0: local")
        row = page.locator('#create-plan tr[data-replica="0"]')
        expect(row.locator("td.node")).to_have_text("local")
        expect(row.locator("td.held")).to_have_text("held")
        expect(row.locator("td.fit")).to_have_text("fits")
        expect(create).to_be_enabled()
        # A change to the form asks for a new preview first.
        page.get_by_label("Concurrency").fill("3")
        expect(create).to_be_disabled()
        page.get_by_label("Concurrency").fill("2")
        page.get_by_label("Concurrency").press("Enter")  # the keyboard previews too
        expect(create).to_be_enabled()
        screenshot(page, "services-create")

        # Create and start (the checkbox): the list shows it, its page says ready live.
        expect(page.get_by_label("Start it once created")).to_be_checked()
        create.click()
        done = page.locator("#create-done")
        expect(done).to_contain_text("Created made and started it")
        listed = page.locator("#services tbody tr").filter(has_text="made")
        expect(listed).to_have_count(1)
        service_id = listed.get_attribute("data-service-id")
        assert service_id
        done.get_by_role("link", name="Open made").click()
        page.wait_for_url(f"**/ui/services/{service_id}")
        expect(page.get_by_role("heading", level=1)).to_have_text("made")
        expect(page.locator("#state .badge")).to_have_text("ready", timeout=READY_MS)

        # A chat through the API answers; then it is stopped (the page says so live).
        _chat_and_stop(url, operator_token, service_id)
        expect(page.locator("#state .badge")).to_have_text("stopped", timeout=60_000)

        # A second create with the same alias: 409 service_exists, said at the alias.
        page.get_by_role("link", name="Services", exact=True).first.click()
        page.wait_for_url("**/ui/services")
        _fill(page, model_id, "made", 512, 2)
        page.get_by_role("button", name="Preview").click()
        expect(page.locator("#create-verdict")).to_contain_text("It fits")
        with watch.provoking(409, r"/api/v1/inference$"):
            create.click()
            alias_error = page.locator("#create-alias-error")
            expect(alias_error).to_be_visible()
            expect(alias_error).to_contain_text("made")
        expect(page.get_by_label("Alias", exact=True)).to_have_attribute("aria-invalid", "true")
        expect(page.get_by_label("Alias", exact=True)).to_be_focused()
        expect(page.locator("#services tbody tr")).to_have_count(1)

        # The scaling fields: an on-demand service's replica is planned, not held.
        _fill(page, model_id, "lazy", 512, 2)
        page.get_by_label("Minimum replicas").fill("0")
        page.get_by_label("Maximum replicas").fill("1")
        page.get_by_label("Idle timeout (s)").fill("60")
        page.get_by_role("button", name="Preview").click()
        expect(page.locator("#create-completed")).to_contain_text("min 0, max 1, idle 60 s")
        expect(page.locator('#create-plan tr[data-replica="0"] td.held')).to_have_text("planned")
        expect(create).to_be_enabled()
        for label in ("Minimum replicas", "Maximum replicas", "Idle timeout (s)"):
            page.get_by_label(label).fill("")

        # Too much memory (the KV cache of 2,048 tokens x 4,096 requests): the plan says
        # why at its replica, and Create stays disabled.
        _fill(page, model_id, "huge", 2048, 4096)
        expect(alias_error).to_be_hidden()
        page.get_by_role("button", name="Preview").click()
        expect(page.locator("#create-verdict")).to_contain_text("It does not fit")
        row = page.locator('#create-plan tr[data-replica="0"]')
        expect(row.locator("td.fit")).to_have_text("does not fit")
        expect(row.locator("td.reasons")).to_contain_text("memory")
        expect(create).to_be_disabled()

        # At phone width the form, the plan and the list fit (tables scroll in place).
        page.set_viewport_size({"width": 390, "height": 844})
        expect(page.get_by_role("button", name="Preview")).to_be_visible()
        assert fits_width(page)
        screenshot(page, "services-create-phone")
        watch.check()
        dashboard_watch.check()


def _without_inference_read(url: str) -> None:
    from playwright.sync_api import expect

    with chromium(chromium_or_skip()) as browser:
        page, watch = open_page(browser, url)
        log_in(page, *ALICE, "")  # a personal session: no project, no project scopes
        leave_dashboard(page, "/ui/services")
        expect(page.locator('.note[data-for="services"]')).to_have_text(
            "This session lacks the inference:read scope that listing services needs."
        )
        expect(page.locator("#refreshed")).not_to_have_text("Loading…")
        expect(page.locator("#create-note")).to_have_text(
            "Creating a service needs the inference:manage and models:read scope(s), "
            "which this session lacks."
        )
        expect(page.locator("#create-form")).to_be_hidden()
        expect(page.get_by_role("button", name="Preview")).to_have_count(0)
        watch.check()


@pytest.mark.deadline(310)
async def test_a_session_that_cannot_list_services_is_told_so_and_shown_no_form(tmp_path):
    chromium_or_skip()
    async with open_inference_controller(
        tmp_path, embedded=False, console_refresh=60
    ) as controller:
        await add_alice(controller, projects={})
        with trio.fail_after(300):
            await trio.to_thread.run_sync(
                _without_inference_read, controller.url, abandon_on_cancel=True
            )


@pytest.mark.deadline(610)
async def test_a_service_is_previewed_created_and_started_from_the_services_page(tmp_path):
    chromium_or_skip()
    with trio.fail_after(600):
        async with open_inference_controller(tmp_path, console_refresh=0.5) as controller:
            await add_alice(controller)
            model_id = await register_smollm2(controller)
            await trio.to_thread.run_sync(
                _create_from_the_page,
                controller.url,
                model_id,
                controller.token,
                abandon_on_cancel=True,
            )
