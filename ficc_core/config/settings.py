"""The :class:`Config` object: every section's settings in one frozen value."""

from __future__ import annotations

from pathlib import Path

import attrs

from .auth import AuthSettings
from .console import ConsoleSettings
from .controllers import ControllerSettings
from .fields import default_runtime_dir
from .gateway import GatewaySettings
from .inference import InferenceSettings
from .limits import LimitSettings
from .logs import LogSettings
from .models import ModelSettings
from .nodes import NodeSettings
from .priority import PrioritySettings
from .routing import RoutingSettings
from .scaling import ScalingSettings
from .server import ServerSettings
from .store import StoreSettings
from .usage import UsageSettings


def _own(_cls: type, fields: list[attrs.Attribute]) -> list[attrs.Attribute]:
    """Make every section's setting Config's own, as when one class declared them all:
    attrs names a setting's Attribute (``inherited`` included) in its validators' errors,
    which stay word for word."""
    return [field.evolve(inherited=False) for field in fields]


# attrs collects the sections' fields from the last base to the first, so the bases are
# listed in reverse: the settings' order (the reference, --help, ``ficc config``) is
# server, auth, logs, store, models, nodes, inference, controllers, gateway, priority,
# routing, limits, scaling, usage, console.
@attrs.frozen(field_transformer=_own)
class Config(
    ConsoleSettings,
    UsageSettings,
    ScalingSettings,
    LimitSettings,
    RoutingSettings,
    PrioritySettings,
    GatewaySettings,
    ControllerSettings,
    InferenceSettings,
    NodeSettings,
    ModelSettings,
    StoreSettings,
    LogSettings,
    AuthSettings,
    ServerSettings,
):
    """Every setting of a FICC controller, with its embedded default."""

    @property
    def blobs_path(self) -> Path:
        """The content-addressed blob store inside :attr:`data_dir`."""
        return self.data_dir / "blobs"

    @property
    def database_path(self) -> Path:
        """The SQLite database file inside :attr:`data_dir`."""
        return self.data_dir / "ficc.sqlite3"

    @property
    def agent_path(self) -> Path:
        """The embedded agent's state directory (:attr:`agent_dir`, else inside data_dir)."""
        return self.agent_dir if self.agent_dir is not None else self.data_dir / "agent"

    @property
    def runtime_path(self) -> Path:
        """The engines' socket directory (:attr:`runtime_dir`, else ``/tmp/ficc-<uid>``)."""
        return self.runtime_dir if self.runtime_dir is not None else default_runtime_dir()

    @property
    def tls(self) -> bool:
        """Whether the service speaks HTTPS."""
        return self.tls_certfile is not None and self.tls_keyfile is not None
