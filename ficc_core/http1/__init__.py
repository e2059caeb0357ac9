"""HTTP/1.1, one module per concern, below the executor so that every layer may use it.

- :mod:`~ficc_core.http1.server`: hypercorn's HTTP/1.1 protocol, parsed by llhttp.
- :mod:`~ficc_core.http1.response_end`: a response's last send is not cancelled by the
  disconnect it causes (a hypercorn workaround, ASGI middleware).
- :mod:`~ficc_core.http1.client_watch`: an invoke request's client, watched once the
  request lasts.
- :mod:`~ficc_core.http1.engine_codec` and :mod:`~ficc_core.http1.events`: an engine
  connection's framing, a response as the events of a stream.
- :mod:`~ficc_core.http1.client`: one ``GET`` over TLS on a blocking socket, for the
  registry's fetches.

Nothing is imported here: a node loads the engine codec without hypercorn.
"""
