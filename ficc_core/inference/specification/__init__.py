"""Specification: a service's specification checked, completed and placed.

The checks of a specification and of a change to it (admission, tiers, transitions),
its placement beside every reservation, the suggestion that completes a partial one,
the model context it runs, and which of its placements run (:mod:`.replicas`).
Pure rules and the transactions that record an admission; nothing here drives an
engine.
"""
