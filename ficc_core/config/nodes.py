"""Nodes (docs/agents.md): the embedded agent, heartbeats, unreachable and lost nodes."""

from __future__ import annotations

from pathlib import Path

import attrs

from .fields import setting


@attrs.frozen(slots=False)
class NodeSettings:
    """The embedded agent and the nodes (a section of Config)."""

    embedded_agent: bool = setting(
        True,
        "Run a local executor agent (process provider) inside 'ficc serve' as node node_name.",
        kind="bool",
    )
    node_name: str = setting(
        "local",
        "Node ID of the embedded agent, as placements and /contributors name it.",
        kind="str",
    )
    agent_config: Path | None = setting(
        None,
        "TOML file declaring an agent's labels and installed runtimes (see docs/agents.md).",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    agent_dir: Path | None = setting(
        None,
        "Agent state directory (attempt records, engine logs and working directories; "
        "any length). Default: data_dir/agent.",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    runtime_dir: Path | None = setting(
        None,
        "Directory for the engines' Unix sockets, private to this user (created 0700). "
        "A socket path must fit in 107 bytes, so it may be at most 56 bytes long. "
        "Default: /tmp/ficc-<uid>, short whatever HOME and data_dir are.",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    heartbeat_interval: float = setting(
        2.0,
        "How often an agent reports its snapshot and attempts to the controller (duration).",
        kind="duration",
    )
    unreachable_after: float = setting(
        15.0,
        "A node unheard this long is unreachable: it gets no new work (duration).",
        kind="duration",
    )
    lost_after: float = setting(
        60.0,
        "A node unheard this long is lost: its attempts become unknown (duration).",
        kind="duration",
    )
    lease_duration: float = setting(
        30.0,
        "How long an attempt may run without a lease renewal before its agent stops it (duration).",
        kind="duration",
    )
