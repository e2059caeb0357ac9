"""The node agent: what runs engines on a node for the controller, embedded or remote."""

from .agent import DEFAULT_LEASE, Agent, Lease
from .gpus import parse_nvidia_smi, query_gpus
from .runtimes import AgentSettings, DeclaredRuntime, check_runtime

__all__ = [
    "DEFAULT_LEASE",
    "Agent",
    "AgentSettings",
    "DeclaredRuntime",
    "Lease",
    "check_runtime",
    "parse_nvidia_smi",
    "query_gpus",
]
