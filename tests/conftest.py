"""Test-wide settings: no downloads, a private profile cache, deterministic torch."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config) -> None:
    import tempfile

    os.environ.setdefault("MEMPLAN_CACHE_DIR", tempfile.mkdtemp(prefix="memplan-cache-"))
