"""Fixtures only the tests of tests/web/ use (shared ones are in tests/conftest.py)."""
