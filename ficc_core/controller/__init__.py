"""The controller's assembly: every component built once, and the HTTP servers around it."""

from .service import Service, open_service

__all__ = ["Service", "open_service"]
