"""Authentication: projects, users, bearer credentials, sessions and scopes."""

from .principal import Principal, PrincipalKind
from .scopes import ADMIN, ALL_SCOPES, PROJECT_SCOPES, check_scopes
from .service import AuthService

__all__ = [
    "ADMIN",
    "ALL_SCOPES",
    "PROJECT_SCOPES",
    "AuthService",
    "Principal",
    "PrincipalKind",
    "check_scopes",
]
