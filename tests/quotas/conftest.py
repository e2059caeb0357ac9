"""Fixtures only the tests of tests/quotas/ use (shared ones are in tests/conftest.py)."""
