"""Run a tests/reference/ script under GigaTrain 1.1.0 (its own interpreter) and under ours.

The reference interpreter: $GIGATRAIN_REF_PYTHON, else .venv-gigatrain/bin/python in the repository
(built by tests/reference/'s set-up); without one the comparison tests skip."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference_python():
    candidates = [os.environ.get("GIGATRAIN_REF_PYTHON"), os.path.join(ROOT, ".venv-gigatrain", "bin", "python")]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def run_script(python, script, cases=None, cwd=None):
    """The script's JSON output; run from a folder outside the repository so that `giga_train`
    is whatever that interpreter has installed (ours: the editable install)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = ROOT if python == sys.executable else ""
    proc = subprocess.run([python, os.path.join(ROOT, "tests", "reference", script)],
                          input=json.dumps(cases) if cases is not None else "", capture_output=True, text=True,
                          cwd=cwd or "/", env=env, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"{script} under {python} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def compare_with_reference(script, cases=None):
    """(reference output, our output) of `script`; skips without a reference interpreter."""
    python = reference_python()
    if python is None:
        pytest.skip("no GigaTrain 1.1.0 interpreter ($GIGATRAIN_REF_PYTHON or .venv-gigatrain)")
    ref = run_script(python, script, cases)
    assert ref["version"] == "1.1.0", f"{python} imports giga_train {ref['version']}, not GigaTrain 1.1.0"
    ours = run_script(sys.executable, script, cases)
    assert ours["version"] != "1.1.0"
    return ref, ours
