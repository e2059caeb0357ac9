"""Fixtures only the tests of tests/metrics/ use (shared ones are in tests/conftest.py)."""
