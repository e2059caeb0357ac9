"""The HTTP API: every route of ``/api/v1`` and the invoke routes, over the domain packages.

:mod:`.access` declares each route once (method, path, who may call it, CSRF); the
``routes_*`` modules serve them, :mod:`.routes_invoke` hands invoke requests to the
gateway (plain ASGI in front of Quart), the ``views_*`` modules render the domain's records
as JSON and :mod:`.app` builds the Quart application with its error envelope.
"""
