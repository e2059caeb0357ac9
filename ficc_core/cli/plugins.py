"""``ficc plugins``: list the plugins FICC discovered, and why any were refused."""

from __future__ import annotations

from collections.abc import Sequence

import click

from ..plugins import DISABLE_AUTOLOAD_ENV, PluginRecord, PluginSet, build_plugin_manager
from .output import echo_json, json_option

_HEADERS = ("NAME", "KIND", "DISTRIBUTION", "VERSION", "API", "STATUS")


@click.command("plugins")
@json_option
def plugins_command(as_json: bool) -> None:
    """List discovered plugins: what loaded, and why anything was refused.

    A refused plugin does not stop the others, so this command exits 0 whenever
    it could build the report; the STATUS column carries each refusal's reason.
    """
    plugin_set = build_plugin_manager()
    if as_json:
        echo_json(report_data(plugin_set))
        return
    click.echo(render_table(plugin_set.report))
    if not plugin_set.autoload:
        click.echo(f"\nEntry-point autoloading is off: {DISABLE_AUTOLOAD_ENV} is set.")


def report_data(plugin_set: PluginSet) -> dict[str, object]:
    """Return the JSON form of a plugin report."""
    return {
        "autoload": plugin_set.autoload,
        "plugins": [record.to_dict() for record in plugin_set.report],
    }


def render_table(records: Sequence[PluginRecord]) -> str:
    """Render records as an aligned text table, one row each; reasons are never cut."""
    if not records:
        return "No plugins found."
    rows = [_HEADERS] + [_row(record) for record in records]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_HEADERS) - 1)]
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
