"""The node protocol, both ends: how the controller and a node agent talk.

One WebSocket per node, dialled by the agent (``/api/v1/contributors/connect``,
the node credential as a Bearer token). JSON text messages, and binary frames for
relayed bytes:

- the agent names its protocol version when it dials (the ``Ficc-Node-Protocol``
  header, :data:`~ficc_core.nodelink.wire.PROTOCOL_VERSION`); each side takes the
  other one minor version older or newer and both speak the older
  (:func:`~ficc_core.nodelink.wire.negotiate`); outside that window the controller
  answers 426 ``protocol_version_unsupported`` before it registers the node;
- controller → agent ``{"type": "welcome", "node_id", "connection_id",
  "heartbeat_interval", "lease_duration", "role", "term", "protocol_version"}``
  once, first (``role`` is ``leader`` or ``standby``; a controller built before
  there could be a second one sends neither, one before versions no
  ``protocol_version``: 1.0);
- agent → controller ``{"type": "heartbeat", "snapshot": {...}, "attempts": [...]}``;
- controller → agent ``{"type": "renew", "duration": seconds, "term"}`` from a task
  of its own, every third of the lease, so no slow request can delay a renewal;
- controller → agent ``{"type": "command", "request_id", "op", "term", ...}``
  (``launch``, ``stop``, ``status``, ``logs``), answered by agent → controller
  ``{"type": "reply", "request_id", "ok": true, "status": {...}}`` or ``"ok": false``
  with an ``error`` (``code``, ``message``, ``status``, and ``details`` when it has
  any);
- ``term`` is the sender's leader term (absent: 0); the node refuses a ``launch``
  or ``stop`` below the highest it has seen (``stale_term``) and ignores such a
  renewal (:mod:`~ficc_core.nodelink.commands`);
- both ways ``{"type": "relay", ...}`` and binary frames: relayed endpoint streams;
- controller → agent ``{"type": "fenced"}`` or ``{"type": "error", "code", "message"}``
  just before the controller closes the connection, or ``{"type": "goodbye",
  "code": "controller_shutting_down", "message"}`` when it closes it because it is
  stopping (:data:`~ficc_core.nodelink.wire.GOODBYE`): the agent reconnects, with no
  warning.

Modules:

- :mod:`~ficc_core.nodelink.wire`: message forms, frames, bounds, and the one
  mapping of an error's code back to its class (so a node's ``UnknownAttempt``
  is caught as that class on the controller);
- :mod:`~ficc_core.nodelink.links`: the controller's end of commands, local (the
  embedded agent) or over a connection;
- :mod:`~ficc_core.nodelink.relay_controller`: the controller's end of relayed
  streams, the same endpoint action as a provider's;
- :mod:`~ficc_core.nodelink.commands` and :mod:`~ficc_core.nodelink.relay_node`:
  the node's end, running commands and relayed streams on its agent.

The node's end imports nothing of the controller's; the controller's end knows no
registry (``ficc_core.contributors`` serves each connection with it).
"""
