"""Scaling: which placements of a scaled service run, and when that changes.

:mod:`.changes` holds the transactions (grow, shrink, pin), :mod:`.activations` the
failed activations remembered in memory, :mod:`.autoscaler` the component that decides
from the gateway's demand. The reconciler reads what these record; it never imports the
autoscaler.
"""
