"""Fixtures only the tests of tests/usage/ use (shared ones are in tests/conftest.py)."""
