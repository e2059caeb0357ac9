"""Fixtures only the tests of tests/auth/ use (shared ones are in tests/conftest.py)."""
