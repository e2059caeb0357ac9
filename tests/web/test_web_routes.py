"""The web console's server side: shells, redirects, assets, headers, package data."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from ficc_core.api.app import create_app
from ficc_core.config import load_config
from ficc_core.controller.service import open_service
from ficc_core.web import CONTENT_SECURITY_POLICY, Assets, contact_link

WEB = Path(__file__).parents[2] / "ficc_core" / "web"


async def _login(client, password: str) -> str:
    response = await client.post(
        "/api/v1/session", json={"username": "admin", "password": password, "project": "default"}
    )
    assert response.status_code == 201
    return (await response.get_json())["csrf_token"]


def _asset_urls(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', html)


async def test_the_landing_page_is_html_with_a_strict_policy_and_a_labelled_login_form(client):
    response = await client.get("/")
    assert response.status_code == 200
    assert response.content_type == "text/html; charset=utf-8"
    policy = response.headers["Content-Security-Policy"]
    assert policy == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Cache-Control"] == "no-store"
    html = await response.get_data(as_text=True)
    for field in ("username", "password", "project"):
        assert f'<label for="{field}">' in html and f'id="{field}"' in html
    # No inline script: the one script is a module from the server.
    assert re.findall(r"<script[^>]*>", html) == [
        f'<script type="module" src="{Assets.load().url("js/login.js")}">'
    ]
    assert "<style" not in html and " style=" not in html


async def test_every_asset_a_page_names_is_served_with_its_type_and_kept_for_good(client):
    html = await (await client.get("/")).get_data(as_text=True)
    urls = _asset_urls(html)
    assert len(urls) == 3  # icon, stylesheet, script
    types = {}
    for url in urls:
        response = await client.get(url)
        assert response.status_code == 200, url
        assert response.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        types[url.rpartition(".")[2]] = response.content_type
    assert types == {
        "svg": "image/svg+xml",
        "css": "text/css; charset=utf-8",
        "js": "text/javascript; charset=utf-8",
    }


async def test_an_asset_of_another_build_is_served_uncached_and_an_unknown_one_is_404(client):
    response = await client.get("/ui/static/0123456789abcdef/js/api.js")
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-cache"
    build = Assets.load().build
    for name in ("js/nothing.js", "../pages.py", "templates/base.html"):
        response = await client.get(f"/ui/static/{build}/{name}")
        assert response.status_code == 404, name
    response = await client.get(f"/ui/static/{build}/js/nothing.js")
    assert (await response.get_json())["error"]["code"] == "asset_not_found"


async def test_the_dashboard_needs_a_valid_session_and_the_landing_page_leads_to_it(
    client, bootstrap
):
    response = await client.get("/ui/dashboard")
    assert response.status_code == 303
    assert response.headers["Location"] == "/"
    forged = {"Cookie": "ficc_session=ficc_sess_nothing_nothing"}  # no session's cookie
    assert (await client.get("/ui/dashboard", headers=forged)).status_code == 303
    assert (await client.get("/", headers=forged)).status_code == 200
    csrf = await _login(client, bootstrap["password"])
    response = await client.get("/")
    assert response.status_code == 303
    assert response.headers["Location"] == "/ui/dashboard"
    response = await client.get("/ui/dashboard")
    assert response.status_code == 200
    assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    html = await response.get_data(as_text=True)
    assert 'id="logout"' in html and 'data-refresh-ms="5000"' in html
    # Logging out ends it: the dashboard sends the browser back to the login form.
    assert (await client.delete("/api/v1/session", headers={"X-CSRF-Token": csrf})).status_code
    assert (await client.get("/ui/dashboard")).status_code == 303


@pytest.mark.parametrize(
    ("contact", "href", "text"),
    [
        ("ops@example.org", "mailto:ops@example.org", "ops@example.org"),
        ("mailto:ops@example.org", "mailto:ops@example.org", "ops@example.org"),
        ("https://example.org/access", "https://example.org/access", "https://example.org/access"),
        ("#inference on the staff chat", None, "#inference on the staff chat"),
        ("javascript:alert(1)", None, "javascript:alert(1)"),
        ("", None, ""),
    ],
)
def test_the_contact_is_a_link_only_when_it_is_an_address_or_a_web_url(contact, href, text):
    assert contact_link(contact) == (href, text)


async def test_the_landing_page_shows_the_contact_and_notice_escaped(tmp_path):
    config = load_config(
        overrides={
            "data_dir": str(tmp_path / "data"),
            "landing_contact": "https://example.org/access?team=a&b",
            "landing_notice": "Maintenance <b>Friday</b> & Saturday",
            "console_refresh": "1.5s",
        },
        environ={},
    )
    async with open_service(config) as service:
        client = create_app(service).test_client()
        html = await (await client.get("/")).get_data(as_text=True)
    assert '<a id="contact" href="https://example.org/access?team=a&amp;b">' in html
    assert "Maintenance &lt;b&gt;Friday&lt;/b&gt; &amp; Saturday" in html
    assert 'data-refresh-ms="1500"' in html


async def test_without_a_contact_the_landing_page_says_to_ask_the_operator(client):
    html = await (await client.get("/")).get_data(as_text=True)
    assert "Ask the operator of this server" in html
    assert 'id="notice"' not in html


def test_every_console_file_is_package_data_of_the_wheel():
    pyproject = tomllib.loads((WEB.parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["ficc_core.web"]
    files = [
        path.relative_to(WEB)
        for folder in ("templates", "static")
        for path in (WEB / folder).rglob("*")
        if path.is_file()
    ]
    assert len(files) >= 8
    for path in files:
        assert any(path.match(pattern) for pattern in patterns), path
    # And every asset is one the server serves (a known content type).
    served = set(Assets.load().files)
    assert {str(p.relative_to("static")) for p in files if p.parts[0] == "static"} == served


def test_without_chromium_the_browser_tests_skip_but_fail_in_ci(monkeypatch):
    from ..support import web_support

    monkeypatch.setattr(web_support, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setattr(web_support.shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
        web_support.chromium_or_skip()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the browser tests"):
        web_support.chromium_or_skip()


async def test_each_console_page_is_served_and_the_navigation_offers_only_what_a_session_may_use(
    app, service, bootstrap
):
    from ficc_core.auth import ALL_SCOPES
    from ficc_core.web import CONSOLE_PAGES

    member = sorted(set(ALL_SCOPES) - {"admin"})
    await service.auth.create_user("erin", "erin-password-1", projects={"default": member})
    pages = {page.name: page for page in CONSOLE_PAGES}
    assert {"dashboard", "keys", "usage", "admin"} <= set(pages)
    assert pages["admin"].scope == "admin"
    anonymous = app.test_client()
    for page in CONSOLE_PAGES:
        response = await anonymous.get(page.path)
        assert response.status_code == 303, page.path
        assert response.headers["Location"] == "/"

    admin = app.test_client()
    await _login(admin, bootstrap["password"])
    for page in CONSOLE_PAGES:
        # A page for one item (/ui/services/<service_id>) is served for any ID.
        response = await admin.get(re.sub(r"<[^>]+>", "any-id", page.path))
        assert response.status_code == 200, page.path
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        html = await response.get_data(as_text=True)
        assert f'src="{Assets.load().url(f"js/{page.name}.js")}"' in html
        assert re.search(r'<a href="/ui/admin"[^>]*>Administration</a>', html)
        if page.nav:
            assert f'<a href="{page.path}" aria-current="page">{page.title}</a>' in html
        else:  # reached from a list, not from the navigation
            assert 'aria-current="page"' not in html
        assert "<style" not in html and " style=" not in html
    assert 'id="users"' in await (await admin.get("/ui/admin")).get_data(as_text=True)

    erin = app.test_client()
    login = await erin.post(
        "/api/v1/session",
        json={"username": "erin", "password": "erin-password-1", "project": "default"},
    )
    assert login.status_code == 201
    html = await (await erin.get("/ui/keys")).get_data(as_text=True)
    assert '<a href="/ui/usage">Usage</a>' in html and "/ui/admin" not in html
    html = await (await erin.get("/ui/admin")).get_data(as_text=True)
    assert 'id="not-admin"' in html and 'id="users"' not in html and "/ui/admin" not in html
