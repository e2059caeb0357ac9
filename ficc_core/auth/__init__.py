"""Authentication: projects, users, bearer credentials, sessions and scopes."""

from .scopes import ADMIN, ALL_SCOPES, PROJECT_SCOPES, check_scopes
from .service import AuthService, Principal

__all__ = ["ADMIN", "ALL_SCOPES", "PROJECT_SCOPES", "AuthService", "Principal", "check_scopes"]
