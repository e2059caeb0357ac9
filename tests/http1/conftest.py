"""Fixtures only the tests of tests/http1/ use (shared ones are in tests/conftest.py)."""
