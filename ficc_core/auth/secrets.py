"""Random bearer secrets and password hashes.

Credentials and session cookies are 256-bit random secrets, so a single sha256
stores them safely at rest and checks them in microseconds on every request.
Passwords are chosen by people and need a memory-hard KDF: argon2id, computed in
a worker thread because one hash takes tens of milliseconds.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import argon2
import trio

_password_hasher = argon2.PasswordHasher()
# Verifying against this keeps unknown usernames as slow as wrong passwords.
_DUMMY_HASH = _password_hasher.hash(secrets.token_urlsafe(16))

TOKEN_PREFIX = "ficc_"


def new_id() -> str:
    """Return a random 16-hex-digit identifier."""
    return secrets.token_hex(8)


def new_secret() -> str:
    """Return a random URL-safe secret of 256 bits."""
    return secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """Return the at-rest form of a random secret."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    """Compare a presented secret with its stored hash in constant time."""
    return hmac.compare_digest(hash_secret(secret), stored_hash)


def make_token(identifier: str, secret: str, prefix: str = TOKEN_PREFIX) -> str:
    """Join an identifier and a secret into the string handed to a client."""
    return f"{prefix}{identifier}.{secret}"


def split_token(token: str, prefix: str = TOKEN_PREFIX) -> tuple[str, str] | None:
    """Return ``(identifier, secret)`` of a token, or ``None`` if it is not one of ours."""
    if not token.startswith(prefix):
        return None
    identifier, dot, secret = token[len(prefix) :].partition(".")
    if not dot or not identifier or not secret or len(token) > 256:
        return None
    return identifier, secret


async def hash_password(password: str, limiter: trio.CapacityLimiter) -> str:
    """Return the argon2id hash of ``password`` (computed off the event loop).

    Each hash holds 64 MiB for a moment: ``limiter`` bounds how many run at once.
    """
    return await trio.to_thread.run_sync(_password_hasher.hash, password, limiter=limiter)


async def verify_password(
    password: str, stored_hash: str | None, limiter: trio.CapacityLimiter
) -> bool:
    """Check ``password`` against ``stored_hash`` (or a dummy) off the event loop."""

    def verify() -> bool:
        try:
            return _password_hasher.verify(stored_hash or _DUMMY_HASH, password) and bool(
                stored_hash
            )
        except argon2.exceptions.VerificationError:
            return False
        except argon2.exceptions.InvalidHashError:
            return False

    return await trio.to_thread.run_sync(verify, limiter=limiter)
