"""The services tests' logs go to a pytest temporary directory (tests/services/launcher.py `LOG_DIR`)."""
from __future__ import annotations

import pytest

from tests.services import launcher


@pytest.fixture(scope="session", autouse=True)
def services_log_dir(tmp_path_factory):
    launcher.LOG_DIR = tmp_path_factory.mktemp("services-logs")
    yield launcher.LOG_DIR
    launcher.LOG_DIR = None
