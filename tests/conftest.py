"""Shared test configuration: the ACP schema location and Hypothesis profiles."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings

REPO_ROOT = Path(__file__).resolve().parent.parent

# The default suite replays the same examples on every run, so a CI verdict depends on the
# code and not on the draw; the "long" profile (nox -s long) explores with fresh randomness.
settings.register_profile(
    "default",
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long",
    deadline=None,
    max_examples=5000,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def acp_schema_dir() -> Path:
    """Where the official ACP v1 schema lives (``ACP_SCHEMA_DIR``, else ``../shared``)."""
    env = os.environ.get("ACP_SCHEMA_DIR")
    if env:
        return Path(env)
    return REPO_ROOT.parent / "shared" / "acp-schema" / "v1"
