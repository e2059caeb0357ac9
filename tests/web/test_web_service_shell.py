"""The services list's and a service page's shells on the server side: the session they
need, the navigation, their assets (and every module those import) served and shipped."""

from __future__ import annotations

import re
from pathlib import Path

from ficc_core.web import CONSOLE_PAGES, CONTENT_SECURITY_POLICY, Assets

STATIC = Path(__file__).parents[2] / "ficc_core" / "web" / "static"


async def _login(client, password: str) -> str:
    response = await client.post(
        "/api/v1/session", json={"username": "admin", "password": password, "project": "default"}
    )
    assert response.status_code == 201
    return (await response.get_json())["csrf_token"]


def test_the_service_pages_are_console_pages_and_only_the_list_is_in_the_navigation():
    pages = {page.name: page for page in CONSOLE_PAGES}
    assert pages["services"].path == "/ui/services" and pages["services"].nav
    assert pages["service"].path == "/ui/services/<service_id>" and not pages["service"].nav


async def test_the_service_pages_need_a_session_and_link_their_assets(client, bootstrap):
    for path in ("/ui/services", "/ui/services/svc_anything"):
        response = await client.get(path)
        assert response.status_code == 303 and response.headers["Location"] == "/", path
    await _login(client, bootstrap["password"])

    response = await client.get("/ui/services")
    assert response.status_code == 200
    assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    html = await response.get_data(as_text=True)
    assert '<a href="/ui/services" aria-current="page">Services</a>' in html
    assert "/js/services.js" in html

    # Any ID gets the shell: the page's script asks the API, which says 404 for a
    # service of another project or none.
    response = await client.get("/ui/services/svc_anything")
    assert response.status_code == 200
    html = await response.get_data(as_text=True)
    urls = re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', html)
    assert {url.rpartition("/")[2] for url in urls} == {
        "favicon.svg",
        "console.css",
        "service.css",
        "service.js",
    }
    for url in urls:
        assert (await client.get(url)).status_code == 200, url
    # No inline script or style (the policy forbids both), a label for every control.
    assert "<script>" not in html and " style=" not in html and "<style" not in html
    for control in re.findall(r'<(?:select|textarea) id="([^"]+)"', html):
        assert f'<label for="{control}"' in html, control


def test_every_module_the_service_pages_import_is_an_asset():
    assets = Assets.load()
    for module in (
        "services.js",
        "service.js",
        "service_common.js",
        "service_rollout.js",
        "service_events.js",
        "charts.js",
    ):
        source = (STATIC / "js" / module).read_text()
        for imported in re.findall(r'from "\./([^"]+)"', source):
            assert f"js/{imported}" in assets.files, (module, imported)
