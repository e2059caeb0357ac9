"""The process executor provider."""

from __future__ import annotations


class ProcessProvider:
    """Run engine jobs as host processes; the node agent instantiates it with node configuration."""

    API_VERSION = 1
    name = "process"
