"""Driving the web console in a real browser: Debian's chromium through Playwright.

Playwright's sync API runs in one worker thread (``trio.to_thread.run_sync``) while
the controller under test keeps serving on the trio loop; everything a browser test
does with the browser happens inside that one thread.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ficc_core.auth import ALL_SCOPES

CHROMIUM = "/usr/bin/chromium"
#: How long one browser step (a click, an expectation) may take, in milliseconds.
STEP_MS = 20_000
#: The console tests' user (add_alice) and the scopes of a member: all but admin.
ALICE = ("alice", "alice-password-1")
MEMBER_SCOPES = sorted(set(ALL_SCOPES) - {"admin"})


async def add_alice(controller: Any, projects: dict[str, list[str]] | None = None) -> None:
    """Create Alice through ``controller`` (a test controller): a member of project
    default with every scope but admin, or of ``projects`` where given."""
    if projects is None:
        projects = {"default": MEMBER_SCOPES}
    body = {"username": ALICE[0], "password": ALICE[1], "projects": projects}
    await controller.ok("POST", "/api/v1/users", status=201, json=body)


def chromium_or_skip() -> str:
    """The system Chromium's path. Without it (or without Playwright) the test is skipped,
    except in CI (``CI`` set), where it fails: CI installs both (.ci/run, pyproject)."""
    found = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    missing = None
    if found is None:
        missing = "Debian's chromium is not installed (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "Playwright for Python is not installed (pip install playwright)"
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{missing}, and CI must run the browser tests")
        pytest.skip(missing)
    return found


@contextmanager
def chromium(executable: str) -> Iterator[Any]:
    """A headless Chromium (Playwright's ``Browser``), closed on exit."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=STEP_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        try:
            yield browser
        finally:
            browser.close()


class PageWatch:
    """Every console error, uncaught exception, failed request and response of status 400
    or more on a page: a test fails on any it did not provoke (:meth:`provoking`)."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.problems: list[str] = []
        self.allowed: list[tuple[int, re.Pattern[str]]] = []
        self.provoked: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)

    def _allows(self, status: int | None, url: str) -> bool:
        return any(
            (status is None or status == code) and pattern.search(url)
            for code, pattern in self.allowed
        )

    def _console(self, message: Any) -> None:
        if message.type != "error":
            return
        url = (message.location or {}).get("url", "")
        # Chromium logs each response of 400 or more as a console error; one a test
        # provoked is the test's, the others are already problems as responses.
        if message.text.startswith("Failed to load resource") and self._allows(None, url):
            return
        self.problems.append(f"console error: {message.text} ({url})")

    def _failed(self, request: Any) -> None:
        self.problems.append(f"request failed: {request.method} {request.url}: {request.failure}")

    def _response(self, response: Any) -> None:
        if response.status < 400:
            return
        if self._allows(response.status, response.url):
            self.provoked.append(f"{response.status} {response.url}")
            return
        method = response.request.method
        self.problems.append(f"response {response.status}: {method} {response.url}")

    @contextmanager
    def provoking(self, status: int, url_pattern: str) -> Iterator[None]:
        """Allow responses of ``status`` to URLs matching ``url_pattern`` inside the block,
        and require at least one."""
        entry = (status, re.compile(url_pattern))
        before = len(self.provoked)
        self.allowed.append(entry)
        try:
            yield
        finally:
            self.allowed.remove(entry)
        assert len(self.provoked) > before, f"no {status} response from {url_pattern} came"

    def check(self) -> None:
        assert not self.problems, "\n".join(self.problems)


def screenshot_folder() -> Path | None:
    """Where the tests save the console's screenshots (``FICC_SCREENSHOTS``), or None."""
    folder = os.environ.get("FICC_SCREENSHOTS")
    if not folder:
        return None
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path


def screenshot(page: Any, name: str) -> None:
    """Save a full-page screenshot ``name``.png when screenshots are asked for."""
    folder = screenshot_folder()
    if folder is not None:
        page.screenshot(path=str(folder / f"{name}.png"), full_page=True, animations="disabled")


@contextmanager
def tolerating(watch: PageWatch, status: int, url_pattern: str) -> Iterator[None]:
    """Allow responses of ``status`` to URLs matching ``url_pattern`` inside the block,
    without requiring one: for a race the test cannot rule out and answers as a person
    would (a 409 ``stale_revision`` while the reconciler moves a service on, say)."""
    entry = (status, re.compile(url_pattern))
    watch.allowed.append(entry)
    try:
        yield
    finally:
        watch.allowed.remove(entry)


class StreamWatch(PageWatch):
    """A :class:`PageWatch` that also lets the page abort a request of its own (the chat's
    Stop button aborting its stream, which Chromium reports as a failed request) inside
    :meth:`aborting`; any other failed request is still a problem."""

    def __init__(self, page: Any) -> None:
        self.aborting_patterns: list[re.Pattern[str]] = []
        self.aborted: list[str] = []
        super().__init__(page)

    def _failed(self, request: Any) -> None:
        failure = request.failure or ""
        if "ERR_ABORTED" in failure and any(p.search(request.url) for p in self.aborting_patterns):
            self.aborted.append(request.url)
            return
        super()._failed(request)

    @contextmanager
    def aborting(self, url_pattern: str) -> Iterator[None]:
        """Allow the page to abort requests to URLs matching ``url_pattern`` inside the
        block, and require at least one."""
        pattern = re.compile(url_pattern)
        before = len(self.aborted)
        self.aborting_patterns.append(pattern)
        try:
            yield
        finally:
            self.aborting_patterns.remove(pattern)
        assert len(self.aborted) > before, f"no request to {url_pattern} was aborted"


def open_page(
    browser: Any, url: str, width: int = 1280, height: int = 900
) -> tuple[Any, PageWatch]:
    """A page in a fresh browser context (its own cookies) at ``url``, and its watch."""
    context = browser.new_context(base_url=url, viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(STEP_MS)
    return page, PageWatch(page)


def log_in(page: Any, username: str, password: str, project: str) -> None:
    """Log in through the landing page's form; wait for the dashboard."""
    page.goto("/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_label("Project").fill(project)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/ui/dashboard")


def fits_width(page: Any) -> bool:
    """Nothing on the page is wider than the window (tables scroll inside their region)."""
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def leave_dashboard(page: Any, path: str) -> None:
    """Open ``path`` from the dashboard once its first refresh is answered, so no request
    of its is cut off by the navigation (a failed request to PageWatch). Use it with a
    ``console_refresh`` longer than the test's steps on the dashboard."""
    from playwright.sync_api import expect

    expect(page.locator("body")).to_have_attribute("data-refreshes", re.compile(r"^\d+$"))
    page.goto(path)


@contextmanager
def abandoning(watch: PageWatch, url_pattern: str) -> Iterator[None]:
    """Inside the block, requests to URLs matching ``url_pattern`` that the browser
    abandons (``net::ERR_ABORTED``: the page navigated away while they were in flight)
    are the test's doing, not problems. Other failures still are."""
    pattern = re.compile(url_pattern)
    before = len(watch.problems)
    try:
        yield
    finally:
        kept = watch.problems[:before]
        for problem in watch.problems[before:]:
            # "request failed: METHOD URL: net::ERR_ABORTED"
            aborted = problem.startswith("request failed: ") and "ERR_ABORTED" in problem
            if aborted and pattern.search(problem):
                watch.provoked.append(problem)
            else:
                kept.append(problem)
        watch.problems[:] = kept
