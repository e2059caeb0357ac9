"""Fixtures only the tests of tests/contributors/ use (shared ones are in tests/conftest.py)."""
