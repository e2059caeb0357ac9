"""``ficc plugins``: list the plugins FICC discovered, the runtimes they declare, and refusals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from ..base.digests import file_digest
from ..plugins import (
    DISABLE_AUTOLOAD_ENV,
    DeclaredRuntime,
    PluginRecord,
    PluginSet,
    build_plugin_manager,
)
from .output import echo_json, json_option

_HEADERS = ("NAME", "KIND", "DISTRIBUTION", "VERSION", "API", "STATUS")
_RUNTIME_HEADERS = ("RUNTIME", "ENGINES", "PROVIDER", "ISOLATION", "EXECUTABLE", "IMAGE DIGEST")


@click.command("plugins")
@json_option
def plugins_command(as_json: bool) -> None:
    """List discovered plugins: what loaded, and why anything was refused.

    A refused plugin does not stop the others, so this command exits 0 whenever
    it could build the report; the STATUS column carries each refusal's reason.
    Below the table, the runtimes installed distributions declare, each with the
    digest of its executable as a node here advertises it.
    """
    plugin_set = build_plugin_manager()
    if as_json:
        echo_json(report_data(plugin_set))
        return
    click.echo(render_table(plugin_set.report))
    runtimes = [runtime_data(runtime) for runtime in plugin_set.runtimes.declared()]
    if runtimes:
        click.echo("\n" + render_runtimes(runtimes))
    if not plugin_set.autoload:
        click.echo(f"\nEntry-point autoloading is off: {DISABLE_AUTOLOAD_ENV} is set.")


def report_data(plugin_set: PluginSet) -> dict[str, object]:
    """Return the JSON form of a plugin report, with the declared runtimes."""
    return {
        "autoload": plugin_set.autoload,
        "plugins": [record.to_dict() for record in plugin_set.report],
        "runtimes": [runtime_data(runtime) for runtime in plugin_set.runtimes.declared()],
    }


def runtime_data(runtime: DeclaredRuntime) -> dict[str, Any]:
    """One declared runtime as JSON, with its executable's digest (or why there is none)."""
    digest, problem = None, None
    if runtime.executable is not None:
        try:
            digest = file_digest(runtime.executable)
        except OSError as exc:
            problem = f"cannot read {runtime.executable}: {exc.strerror or exc}"
    return {
        "name": runtime.name,
        "provider": runtime.provider,
        "engines": list(runtime.engines),
        "executable": None if runtime.executable is None else str(runtime.executable),
        "isolation": runtime.isolation,
        "network": runtime.network,
        "image_digest": digest,
        "problem": problem,
    }


def render_table(records: Sequence[PluginRecord]) -> str:
    """Render records as an aligned text table, one row each; reasons are never cut."""
    if not records:
        return "No plugins found."
    return _aligned([_HEADERS, *(_row(record) for record in records)])


def render_runtimes(runtimes: Sequence[dict[str, Any]]) -> str:
    """Render ``runtime_data`` entries as an aligned table; a problem replaces the digest."""
    rows = [
        (
            item["name"],
            ",".join(item["engines"]) or "-",
            item["provider"],
            item["isolation"] or "-",
            item["executable"] or "-",
            item["image_digest"] or f"missing: {item['problem']}",
        )
        for item in runtimes
    ]
    return _aligned([_RUNTIME_HEADERS, *rows])


def _aligned(rows: Sequence[Sequence[str]]) -> str:
    """Left-align every column but the last, which is never padded or cut."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def _row(record: PluginRecord) -> tuple[str, ...]:
    status = record.status if record.reason is None else f"{record.status}: {record.reason}"
    return (
        record.name,
        record.kind,
        record.distribution or "-",
        record.version or "-",
        "-" if record.api_version is None else str(record.api_version),
        status,
    )
