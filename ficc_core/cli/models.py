"""``ficc models ...``: the model registry from the command line, through the HTTP API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from .client import ApiClient, client_from
from .models_transfer import (
    COMMANDS,
    follow_acquisition,
    gguf_document,
    gguf_parts,
    read_local_gguf,
    summary,
    upload_file,
)
from .output import echo_json, echo_table, json_option
from .resolve import resolve

_MiB = 1 << 20


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
    help="Build the manifest from this local GGUF (hashes it; any part of a split GGUF "
    "registers all its parts).",
)
@click.option(
    "--name", help="Model name for --gguf (default: its general.basename, else the file name)."
)
@click.option("--licence", help="Licence for --gguf.")
@json_option
@click.pass_context
def register(
    ctx: click.Context,
    manifest: Path | None,
    gguf: Path | None,
    name: str | None,
    licence: str | None,
    as_json: bool,
) -> None:
    """Register a manifest from MANIFEST (JSON) or from a local --gguf file.

    This registers only; `ficc models add FILE` registers and uploads in one step.
    """
    if (manifest is None) == (gguf is None):
        raise click.UsageError("give either MANIFEST or --gguf PATH")
    if manifest is not None:
        document = json.loads(manifest.read_text(encoding="utf-8"))
    else:
        assert gguf is not None  # one of the two, checked above
        parts = gguf_parts(gguf)
        document = gguf_document(parts, name, licence, read_local_gguf(parts))
    model = _client(ctx).json("POST", "/api/v1/models", json=document)
    if as_json:
        echo_json(model)
        return
    lines = summary(model, "registered")
    if model["state"] != "verified" and gguf is not None:
        lines[-1] = f"next: ficc models add {gguf}  (uploads it; or ficc models upload)"
    for line in lines:
        click.echo(line)


def _model_id(ctx: click.Context, name_or_id: str) -> str:
    return resolve(_client(ctx), "models", name_or_id)


@models.command("list")
@json_option
@click.pass_context
def list_models(ctx: click.Context, as_json: bool) -> None:
    """List the project's models with their state."""
    found = _client(ctx).json("GET", "/api/v1/models")["models"]
    if as_json:
        echo_json({"models": found})
        return
    rows: list[tuple[Any, ...]] = [("ID", "NAME", "FORMAT", "STATE", "VERIFIED")]
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
    echo_table(rows)


def _count(value: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return str(value)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def show_lines(model: dict[str, Any]) -> list[str]:
    """``ficc models show``'s human form of a model (``GET /models/{id}``)."""
    rows: list[tuple[str, Any]] = [
        ("model", f"{model['name']} (ID {model['id']})"),
        ("state", model["state"]),
        ("format", model["format"]),
        ("size", f"{model['size'] / _MiB:.1f} MiB"),
    ]
    metadata = model.get("metadata")
    if metadata:
        quantisation = metadata["quantisation"] or "unknown"
        if metadata["file_type"] is not None:
            quantisation += f" (file type {metadata['file_type']})"
        rows += [
            ("architecture", metadata["architecture"]),
            ("parameters", _count(metadata["parameter_count"])),
            ("context length", metadata["context_length"] or "unknown"),
            ("quantisation", quantisation),
            ("chat template", _yes(metadata["chat_template"])),
            ("embedding model", _yes(metadata["embedding"])),
        ]
        if metadata.get("split_count"):
            rows.append(("split", f"{metadata['split_count']} parts"))
    elif model["format"] == "gguf":
        rows.append(("metadata", "read once the model is verified"))
    manifest = model["manifest"]
    if manifest.get("licence"):
        rows.append(("licence", manifest["licence"]))
    if manifest.get("source"):
        source = manifest["source"]
        rows.append(("source", f"{source['repository']} @ {source['revision']}"))
    width = max(len(label) for label, _ in rows)
    lines = [f"{label.ljust(width)}  {value}" for label, value in rows]
    lines += ["", "files:"]
    for file in model["files"]:
        lines.append(
            f"  {file['index']}  {file['path']}  {file['state']}  "
            f"{file['received_bytes'] / _MiB:.1f}/{file['size'] / _MiB:.1f} MiB"
            + (f"  ({file['reason']})" if file.get("reason") else "")
        )
    return lines


@models.command("show")
@click.argument("model")
@json_option
@click.pass_context
def show(ctx: click.Context, model: str, as_json: bool) -> None:
    """Show MODEL (a name or ID): its GGUF metadata, and each file's state and progress."""
    client = _client(ctx)
    shown = client.json("GET", f"/api/v1/models/{resolve(client, 'models', model)}")
    if as_json:
        echo_json(shown)
        return
    for line in show_lines(shown):
        click.echo(line)


def _state_line(model: dict[str, Any]) -> str:
    return (
        f"{model['name']} (ID {model['id']}): {model['state']}, "
        f"{model['received_bytes'] / _MiB:.1f}/{model['size'] / _MiB:.1f} MiB received"
    )


@models.command("acquire")
@click.argument("model")
@click.option("--wait", is_flag=True, help="Follow the acquisition with a progress bar.")
@click.option("--interval", default=0.5, show_default=True, help="Seconds between polls.")
@json_option
@click.pass_context
def acquire(ctx: click.Context, model: str, wait: bool, interval: float, as_json: bool) -> None:
    """Start or resume the HTTPS acquisition of MODEL (a name or ID)."""
    client = _client(ctx)
    found = client.json("POST", f"/api/v1/models/{_model_id(ctx, model)}/acquire")
    if wait:
        found = follow_acquisition(client, found, interval)
    if as_json:
        echo_json(found)
    elif wait:
        click.echo(f"{found['name']}: {found['state']}")
    else:
        click.echo(_state_line(found))


@models.command("pause")
@click.argument("model")
@json_option
@click.pass_context
def pause(ctx: click.Context, model: str, as_json: bool) -> None:
    """Pause MODEL's acquisition; `acquire` resumes it from the durable offset."""
    found = _client(ctx).json("POST", f"/api/v1/models/{_model_id(ctx, model)}/pause")
    if as_json:
        echo_json(found)
    else:
        click.echo(_state_line(found))


@models.command("upload")
@click.argument("model")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--index", default=0, show_default=True, help="Which file of the manifest.")
@json_option
@click.pass_context
def upload(ctx: click.Context, model: str, path: Path, index: int, as_json: bool) -> None:
    """Upload PATH as file --index of MODEL; an interrupted upload resumes where it stopped."""
    file = upload_file(_client(ctx), _model_id(ctx, model), index, path)
    if as_json:
        echo_json(file)
    else:
        click.echo(f"{file['path']}: {file['state']}")
    if file["state"] != "verified":
        raise click.ClickException(file.get("reason") or f"the file is {file['state']}")


def _preview_row(preview: dict[str, Any]) -> tuple[Any, ...]:
    metadata = preview.get("metadata") or {}
    refusal = preview.get("refusal")
    return (
        preview["filename"],
        f"{preview['size'] / _MiB:.1f} MiB" if "size" in preview else "?",
        len(preview["parts"]) if preview.get("parts") else 1,
        metadata.get("architecture", ""),
        metadata.get("quantisation") or "",
        metadata.get("context_length") or "",
        f"{refusal['code']}: {refusal['message']}" if refusal else "",
    )


@models.command("preview")
@click.argument("repository")
@click.option("--revision", default="main", show_default=True)
@click.option("--file", "--filename", "filename", help="Only this GGUF model of the repository.")
@click.option("--licence", help="Licence to record (default: the repository's card).")
@json_option
@click.pass_context
def preview(
    ctx: click.Context,
    repository: str,
    revision: str,
    filename: str | None,
    licence: str | None,
    as_json: bool,
) -> None:
    """Resolve a hub repository's GGUF models into manifests without downloading weights."""
    body = {"repository": repository, "revision": revision}
    if filename:
        body["filename"] = filename
    if licence:
        body["licence"] = licence
    found = _client(ctx).json("POST", "/api/v1/models/hub-preview", json=body)
    if as_json:
        echo_json(found)
        return
    header = ("FILE", "SIZE", "PARTS", "ARCHITECTURE", "QUANTISATION", "CONTEXT", "REFUSED")
    echo_table([header, *(_preview_row(preview) for preview in found["previews"])])
    click.echo(f"next: ficc models pull {repository} --file FILE")


@models.command("delete")
@click.argument("model")
@click.option("--evict", is_flag=True, help="Also delete content no other model shares.")
@json_option
@click.pass_context
def delete(ctx: click.Context, model: str, evict: bool, as_json: bool) -> None:
    """Delete MODEL's metadata (a name or ID; refused while an inference service uses it)."""
    deleted = _client(ctx).json(
        "DELETE",
        f"/api/v1/models/{_model_id(ctx, model)}",
        params={"evict": "true" if evict else "false"},
    )
    if as_json:
        echo_json(deleted)
        return
    evicted = len(deleted["evicted"])
    click.echo(
        f"deleted model {deleted['name']} (ID {deleted['id']})"
        + (f"; evicted {evicted} blob{'s' * (evicted != 1)}" if evict else "")
    )


for _command in COMMANDS:
    models.add_command(_command)
