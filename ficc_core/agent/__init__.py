"""The node agent: what runs engines on a node for the controller, embedded or remote."""

from .agent import DEFAULT_LEASE, Agent, Lease
from .gpus import GpuDiscovery, GpuInventory, discover_gpus, parse_nvidia_smi_xml, query_gpus
from .runtimes import AgentSettings, DeclaredRuntime, check_runtime

__all__ = [
    "DEFAULT_LEASE",
    "Agent",
    "AgentSettings",
    "DeclaredRuntime",
    "GpuDiscovery",
    "GpuInventory",
    "Lease",
    "check_runtime",
    "discover_gpus",
    "parse_nvidia_smi_xml",
    "query_gpus",
]
