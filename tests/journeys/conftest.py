"""The journeys' fixtures (tests/journeys/journey.py has them and says what they are)."""

from journey import chromium, demo, people, pytest_runtest_makereport  # noqa: F401
