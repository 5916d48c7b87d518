import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# Test modules that compare with the real GigaTrain 1.1.0: they run last, so that the reference venv (built
# in the background by `make test`, or on first use) is ready by the time they need it.
REFERENCE_MODULES = ("test_reference_sanity", "test_gigatrain_differential", "test_schedulers", "test_ema",
                     "test_api_exports", "test_data", "test_giga_datasets")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.module.__name__.rsplit(".", 1)[-1] in REFERENCE_MODULES)


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch):
    """Runners are dotted paths resolved from the working directory, as on the command line."""
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="session")
def reference_docs(tmp_path_factory):
    """The tiny GigaTrain client (tests/reference) recorded under the real GigaTrain 1.1.0, every scenario,
    once per session (the venv is built from the registry on first use)."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.reference import harness
    work = tmp_path_factory.mktemp("gigatrain-reference")
    harness.reference_python()
    with ThreadPoolExecutor(max_workers=2) as pool:  # each scenario is its own subprocess(es)
        futures = {s: pool.submit(harness.record, s, work) for s in harness.SCENARIOS}
        return {s: f.result() for s, f in futures.items()}
