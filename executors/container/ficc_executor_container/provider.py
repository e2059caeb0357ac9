"""The container executor provider."""

from __future__ import annotations


class ContainerProvider:
    """Run engine jobs as containers; the node agent instantiates it with node configuration."""

    API_VERSION = 1
    name = "container"
