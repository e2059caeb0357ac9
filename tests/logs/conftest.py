"""Fixtures only the tests of tests/logs/ use (shared ones are in tests/conftest.py)."""
