"""`[breaker] health` functions for the integration tests."""

from __future__ import annotations

import os


def dependency_up() -> bool:
    """Up unless the file named by $RETRYLIB_TEST_DEPENDENCY_DOWN exists (as `dep-*` records
    of `job_handlers` fail while it does)."""
    return not os.path.exists(os.environ["RETRYLIB_TEST_DEPENDENCY_DOWN"])
