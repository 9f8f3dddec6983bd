"""Where the tests' files lie: the checkout, the tests, their data and the helper scripts run by path."""

from __future__ import annotations

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
REPO_ROOT = TESTS.parent
DATA = TESTS / "data"
