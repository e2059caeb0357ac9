"""The ``ficc`` command line: the group, and a module per command family beside it."""

from __future__ import annotations

import click

from .._version import __version__
from .admin import admin
from .admin_limits import set_limits, show_limits
from .admin_users import users
from .doctor import doctor
from .executor import executor
from .inference import inference
from .keys import keys
from .login import login, logout, whoami
from .migrate_store import migrate_store_command
from .models import models
from .options import install_global_options
from .plugins import plugins_command
from .serve import serve
from .settings import config_command
from .usage import usage


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ficc")
def cli() -> None:
    """FICC Inference: a control plane for self-hosted LLM inference.

    The global options --data-dir, --config, --url and --token are accepted before
    or after any subcommand.
    """


cli.add_command(serve, "serve")
cli.add_command(executor, "executor")
cli.add_command(doctor, "doctor")
cli.add_command(config_command, "config")
cli.add_command(admin, "admin")
admin.add_command(set_limits)
admin.add_command(show_limits)
admin.add_command(users, "users")
admin.add_command(migrate_store_command)
cli.add_command(models, "models")
cli.add_command(inference, "inference")
cli.add_command(plugins_command, "plugins")
cli.add_command(login, "login")
cli.add_command(logout, "logout")
cli.add_command(whoami, "whoami")
cli.add_command(usage, "usage")
cli.add_command(keys, "keys")
install_global_options(
    cli, frozenset({"models", "inference", "login", "logout", "whoami", "usage", "keys"})
)


def main() -> None:
    """Entry point of the ``ficc`` script."""
    cli(prog_name="ficc")
