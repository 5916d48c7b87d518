import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch):
    """Runners are dotted paths resolved from the working directory, as on the command line."""
    monkeypatch.chdir(ROOT)
