"""The console's static assets, read once from the package and served from memory.

Every asset's URL carries the build: a digest of every asset's name and bytes
(``/ui/static/<build>/js/dashboard.js``), so a browser may keep an asset of the
current build for good (``immutable``) and a new release is fetched afresh. The
ES modules import each other by relative paths, which stay inside one build.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from importlib.resources.abc import Traversable

import attrs

#: Content types by file extension; an asset of another extension is not served.
CONTENT_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
}
#: An asset of the current build never changes under its URL.
IMMUTABLE = "public, max-age=31536000, immutable"
#: An asset asked for under another build (a page loaded before an upgrade): served, not kept.
REVALIDATE = "no-cache"


@attrs.frozen
class Asset:
    """One static file: its bytes and content type."""

    body: bytes
    content_type: str


def _walk(folder: Traversable, prefix: str = "") -> dict[str, Asset]:
    found: dict[str, Asset] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        name = prefix + entry.name
        if entry.is_dir():
            found.update(_walk(entry, name + "/"))
            continue
        content_type = CONTENT_TYPES.get("." + entry.name.rpartition(".")[2])
        if content_type is not None:
            found[name] = Asset(entry.read_bytes(), content_type)
    return found


@attrs.frozen
class Assets:
    """The assets under the package's ``static/`` folder and the build they make."""

    files: dict[str, Asset]
    build: str

    @classmethod
    def load(cls) -> Assets:
        files = _walk(resources.files(__package__) / "static")
        digest = hashlib.sha256()
        for name, asset in files.items():
            digest.update(name.encode() + b"\0" + hashlib.sha256(asset.body).digest())
        return cls(files, digest.hexdigest()[:16])

    def url(self, name: str) -> str:
        """The URL of asset ``name`` (``js/dashboard.js``) in this build."""
        if name not in self.files:
            raise KeyError(f"no console asset named {name!r}")
        return f"/ui/static/{self.build}/{name}"

    def get(self, build: str, name: str) -> tuple[Asset, str] | None:
        """Asset ``name`` and the ``Cache-Control`` it is served with, or None."""
        asset = self.files.get(name)
        if asset is None:
            return None
        return asset, IMMUTABLE if build == self.build else REVALIDATE
