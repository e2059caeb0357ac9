"""``ficc models ...``: the model registry from the command line, through the HTTP API."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from ..models.registry import MAX_BYTES_CHUNK
from .client import ApiClient, ApiError, client_from, echo_json
from .output import json_option
from .resolve import resolve

_MiB = 1 << 20


class Progress:
    """A progress line with percentage, rate and ETA on stderr.

    On a terminal it redraws one line; otherwise (logs, CI) it prints a line at most
    every ``every`` seconds and a final one, so progress is visible there too.
    """

    def __init__(self, total: int, label: str, *, start: int = 0, every: float = 2.0) -> None:
        self.total, self.label, self.done = total, label, start
        self._base, self._started = start, time.monotonic()
        self._tty = sys.stderr.isatty()
        self._every, self._last = every, 0.0

    def __enter__(self) -> Progress:
        self._render(force=True)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._render(force=True)
        if self._tty:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def update_to(self, done: int) -> None:
        """Record that ``done`` bytes of ``total`` are complete."""
        self.done = done
        self._render()

    def line(self) -> str:
        """The progress line as it is shown."""
        elapsed = max(time.monotonic() - self._started, 1e-6)
        rate = (self.done - self._base) / elapsed
        percent = 100.0 * self.done / self.total if self.total else 100.0
        remaining = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta = (
            "--:--" if remaining == float("inf") else time.strftime("%M:%S", time.gmtime(remaining))
        )
        return (
            f"{self.label} {percent:5.1f}% {self.done / _MiB:.1f}/{self.total / _MiB:.1f} MiB "
            f"{rate / _MiB:.1f} MiB/s ETA {eta}"
        )

    def _render(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self._tty:
            sys.stderr.write("\r" + self.line())
        elif force or now - self._last >= self._every:
            sys.stderr.write(self.line() + "\n")
        else:
            return
        self._last = now
        sys.stderr.flush()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as handle, Progress(size, f"hashing {path.name}") as progress:
        while chunk := handle.read(4 * _MiB):
            digest.update(chunk)
            progress.update_to(progress.done + len(chunk))
    return digest.hexdigest()


@click.group()
def models() -> None:
    """Register, acquire, upload, preview and delete models (scopes models:read/manage)."""


def _client(ctx: click.Context) -> ApiClient:
    return client_from(ctx)


@models.command("register")
@click.argument(
    "manifest", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--gguf",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Build a one-file GGUF manifest from this local file (hashes it).",
)
@click.option("--name", help="Model name for --gguf (default: the file name without .gguf).")
@click.option("--licence", help="Licence for --gguf.")
@click.pass_context
def register(
    ctx: click.Context,
    manifest: Path | None,
    gguf: Path | None,
    name: str | None,
    licence: str | None,
) -> None:
    """Register a manifest from MANIFEST (JSON) or from a local --gguf file."""
    if (manifest is None) == (gguf is None):
        raise click.UsageError("give either MANIFEST or --gguf PATH")
    if manifest is not None:
        document = json.loads(manifest.read_text(encoding="utf-8"))
    else:
        document = {
            "name": name or gguf.name.removesuffix(".gguf"),
            "format": "gguf",
            "files": [
                {"path": gguf.name, "size": gguf.stat().st_size, "sha256": _file_sha256(gguf)}
            ],
        }
        if licence:
            document["licence"] = licence
    echo_json(_client(ctx).json("POST", "/api/v1/models", json=document))


@models.command("list")
@json_option
@click.pass_context
def list_models(ctx: click.Context, as_json: bool) -> None:
    """List the project's models with their state."""
    found = _client(ctx).json("GET", "/api/v1/models")["models"]
    if as_json:
        echo_json({"models": found})
        return
    rows = [("ID", "NAME", "FORMAT", "STATE", "VERIFIED")]
    for model in found:
        rows.append(
            (
                model["id"],
                model["name"],
                model["format"],
                model["state"],
                f"{model['verified_bytes'] / _MiB:.1f}/{model['size'] / _MiB:.1f} MiB",
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo(
            "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        )


@models.command("show")
@click.argument("model_id")
@click.pass_context
def show(ctx: click.Context, model_id: str) -> None:
    """Show a model: manifest, per-file state and progress."""
    client = _client(ctx)
    echo_json(client.json("GET", f"/api/v1/models/{resolve(client, 'models', model_id)}"))


@models.command("acquire")
@click.argument("model_id")
@click.option("--wait", is_flag=True, help="Follow the acquisition with a progress bar.")
@click.option("--interval", default=0.5, show_default=True, help="Seconds between polls.")
@click.pass_context
def acquire(ctx: click.Context, model_id: str, wait: bool, interval: float) -> None:
    """Start or resume the HTTPS acquisition of MODEL_ID."""
    client = _client(ctx)
    model_id = resolve(client, "models", model_id)
    model = client.json("POST", f"/api/v1/models/{model_id}/acquire")
    if not wait:
        echo_json(model)
        return
    with Progress(model["size"], model["name"], start=model["received_bytes"]) as progress:
        while model["state"] not in ("verified", "failed", "paused"):
            time.sleep(interval)
            model = client.json("GET", f"/api/v1/models/{model_id}")
            progress.update_to(model["received_bytes"])
    click.echo(f"{model['name']}: {model['state']}")
    if model["state"] != "verified":
        reasons = [f"{f['path']}: {f['reason']}" for f in model["files"] if f.get("reason")]
        raise click.ClickException("; ".join(reasons) or f"the acquisition is {model['state']}")


@models.command("pause")
@click.argument("model_id")
@click.pass_context
def pause(ctx: click.Context, model_id: str) -> None:
    """Pause MODEL_ID's acquisition; `acquire` resumes it from the durable offset."""
    client = _client(ctx)
    echo_json(client.json("POST", f"/api/v1/models/{resolve(client, 'models', model_id)}/pause"))


def upload_file(
    client: ApiClient, model_id: str, index: int, path: Path, *, label: str | None = None
) -> dict[str, Any]:
    """Upload ``path`` as file ``index`` of a model, resuming from the server's offset."""
    model = client.json("GET", f"/api/v1/models/{model_id}")
    try:
        file = model["files"][index]
    except IndexError:
        raise click.ClickException(f"model {model_id} has no file {index}") from None
    size = path.stat().st_size
    if size != file["size"]:
        raise click.ClickException(
            f"{path} has {size} bytes; the manifest declares {file['size']} for {file['path']}"
        )
    if file["state"] == "verified":
        return file
    offset = file["received_bytes"]
    route = f"/api/v1/models/{model_id}/files/{index}"
    with (
        path.open("rb") as handle,
        Progress(size, label or file["path"], start=offset) as progress,
    ):
        while offset < size:
            handle.seek(offset)
            chunk = handle.read(MAX_BYTES_CHUNK)
            try:
                file = client.json(
                    "POST",
                    f"{route}/bytes",
                    params={"offset": offset},
                    content=chunk,
                    headers={"Content-Type": "application/octet-stream"},
                )
            except ApiError as exc:
                if exc.error["code"] == "offset_mismatch":
                    offset = exc.error["details"]["offset"]  # resume where the server is
                    continue
                if exc.error["code"] == "too_many_uploads":
                    time.sleep(float(exc.response.headers.get("Retry-After", "1")))
                    continue
                if exc.error["code"] == "file_verified":
                    # The same content was verified through another model meanwhile.
                    return client.json("GET", f"/api/v1/models/{model_id}")["files"][index]
                raise
            offset = file["received_bytes"]
            progress.update_to(offset)
    if file["state"] != "verified":
        # A complete file left unverified by an interruption: the empty upload verifies it.
        file = client.json("POST", route, json={"offset": size, "data": ""})
    return file


@models.command("upload")
@click.argument("model_id")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--index", default=0, show_default=True, help="Which file of the manifest.")
@click.pass_context
def upload(ctx: click.Context, model_id: str, path: Path, index: int) -> None:
    """Upload PATH as file --index of MODEL_ID; an interrupted upload resumes where it stopped."""
    client = _client(ctx)
    file = upload_file(client, resolve(client, "models", model_id), index, path)
    click.echo(f"{file['path']}: {file['state']}")
    if file["state"] != "verified":
        raise click.ClickException(file.get("reason") or f"the file is {file['state']}")


@models.command("preview")
@click.argument("repository")
@click.option("--revision", default="main", show_default=True)
@click.option("--filename", help="Only this GGUF file of the repository.")
@click.option("--licence", help="Licence to record (default: the repository's card).")
@click.pass_context
def preview(
    ctx: click.Context, repository: str, revision: str, filename: str | None, licence: str | None
) -> None:
    """Resolve a hub repository's GGUF files into manifests without downloading weights."""
    body = {"repository": repository, "revision": revision}
    if filename:
        body["filename"] = filename
    if licence:
        body["licence"] = licence
    echo_json(_client(ctx).json("POST", "/api/v1/models/hub-preview", json=body))


@models.command("delete")
@click.argument("model_id")
@click.option("--evict", is_flag=True, help="Also delete content no other model shares.")
@click.pass_context
def delete(ctx: click.Context, model_id: str, evict: bool) -> None:
    """Delete MODEL_ID's metadata (refused while an inference service uses it)."""
    client = _client(ctx)
    echo_json(
        client.json(
            "DELETE",
            f"/api/v1/models/{resolve(client, 'models', model_id)}",
            params={"evict": "true" if evict else "false"},
        )
    )
