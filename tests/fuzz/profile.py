"""The hypothesis settings every fuzz test uses.

``fuzz-ci`` (the default) keeps the suite to a few seconds: 150 examples per test, fixed
derivation (``derandomize``) so that a CI failure reproduces, and no example database.
``KCLASYNC_FUZZ_PROFILE=fuzz-deep`` runs 5,000 random examples per test for a local hunt.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "fuzz-ci",
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz-deep",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

FUZZ = settings.get_profile(os.environ.get("KCLASYNC_FUZZ_PROFILE", "fuzz-ci"))
