"""The ``ficc`` command line: the group, and a module per command family beside it."""

from __future__ import annotations

from pathlib import Path

import click

from .._version import __version__
from .admin import admin
from .executor import executor
from .inference import inference
from .models import models
from .plugins import plugins_command
from .serve import serve
from .settings import config_command


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ficc")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="TOML configuration file (keys are the setting names). [env: FICC_CONFIG]",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Directory for the database and blobs. [env: FICC_DATA_DIR]",
)
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None, data_dir: Path | None) -> None:
    """FICC Inference: a control plane for self-hosted LLM inference."""
    ctx.obj = {"config_path": config_path, "overrides": {"data_dir": data_dir}}


cli.add_command(serve, "serve")
cli.add_command(executor, "executor")
cli.add_command(config_command, "config")
cli.add_command(admin, "admin")
cli.add_command(models, "models")
cli.add_command(inference, "inference")
cli.add_command(plugins_command, "plugins")


def main() -> None:
    """Entry point of the ``ficc`` script."""
    cli(prog_name="ficc")
