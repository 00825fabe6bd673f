"""Shared fixtures and the Hypothesis profiles (``HYPOTHESIS_PROFILE=ci`` in CI: fewer cases;
``thorough`` for a long local hunt)."""

import os

from db_fixtures import db_url, postgres_server, sqlite_url  # noqa: F401
from hypothesis import HealthCheck, settings
from slurm_fixtures import slurm, slurm_cluster  # noqa: F401

settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
