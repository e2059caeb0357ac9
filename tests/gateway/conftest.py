"""Fixtures only the tests of tests/gateway/ use (shared ones are in tests/conftest.py)."""
