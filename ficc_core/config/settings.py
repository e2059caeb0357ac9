"""The :class:`Config` object: every section's settings in one frozen value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attr
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

# The sections in the settings' order (the reference, --help, ``ficc config``).
_SECTIONS = (
    ServerSettings,
    AuthSettings,
    LogSettings,
    StoreSettings,
    ModelSettings,
    NodeSettings,
    InferenceSettings,
    ControllerSettings,
    GatewaySettings,
    PrioritySettings,
    RoutingSettings,
    LimitSettings,
    ScalingSettings,
    UsageSettings,
    ConsoleSettings,
)


def _declared(sections: tuple[type, ...]) -> dict[str, Any]:
    """Every section's settings, in order, declared again as :class:`Config`'s own.

    So Config keeps them in slots, as when one class declared them all, and an attrs
    validator's error, which shows the setting's Attribute, reads word for word as then.
    """
    return {
        field.name: attr.ib(
            default=field.default,
            validator=field.validator,
            converter=field.converter,
            metadata=field.metadata,
            type=field.type,
        )
        for section in sections
        for field in attrs.fields(section)
    }


# The bases are the same sections (they type Config's attributes; attrs reads `these`).
@attrs.frozen(these=_declared(_SECTIONS))
class Config(
    ServerSettings,
    AuthSettings,
    LogSettings,
    StoreSettings,
    ModelSettings,
    NodeSettings,
    InferenceSettings,
    ControllerSettings,
    GatewaySettings,
    PrioritySettings,
    RoutingSettings,
    LimitSettings,
    ScalingSettings,
    UsageSettings,
    ConsoleSettings,
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


if Config.__bases__ != _SECTIONS:  # a section added to one of the two lists only
    raise TypeError("Config's bases and _SECTIONS name the same sections in the same order")
