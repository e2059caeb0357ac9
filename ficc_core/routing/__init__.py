"""The seams between the gateway, inference and the autoscaler, below all three.

The gateway routes requests; inference reconciles services and scales them. Each needs
something of the other at run time, and neither imports the other (an import-linter
``independence`` contract in pyproject.toml): what they share lives here, below both,
and the controller's assembly (:func:`ficc_core.controller.service.open_service`) builds
one of each and hands it to both sides.

- :mod:`.live`: the live routing table the reconciler publishes and the gateway routes by.
- :mod:`.demand`: what the gateway saw of a service's requests, as the autoscaler reads it.
- :mod:`.activation`: the channel the gateway wakes an idle on-demand service by, which
  the autoscaler serves.
- :mod:`.idle`: the signal the reconciler drains a retiring attempt by, which the gateway
  serves.
- :mod:`.bands`: the priority bands (settings parse them; authentication and admission
  use them).
"""
