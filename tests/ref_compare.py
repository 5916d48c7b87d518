"""Run a tests/reference/ script under GigaTrain 1.1.0 (its own interpreter) and under ours.

The reference interpreter: $GIGATRAIN_REF_PYTHON, else the venv tests/reference/harness.py builds from
the registry on first use (.venv-gigatrain): never skipped."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference_python():
    from tests.reference import harness
    given = os.environ.get("GIGATRAIN_REF_PYTHON")
    return given if given else harness.reference_python()


def run_script(python, script, cases=None, cwd=None):
    """The script's JSON output; run from a folder outside the repository so that `giga_train`
    is whatever that interpreter has installed (ours: the editable install)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = ROOT if python == sys.executable else ""
    proc = subprocess.run([python, os.path.join(ROOT, "tests", "reference", script)],
                          input=json.dumps(cases) if cases is not None else "", capture_output=True, text=True,
                          cwd=cwd or "/", env=env, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"{script} under {python} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def compare_with_reference(script, cases=None):
    """(reference output, our output) of `script`."""
    python = reference_python()
    ref = run_script(python, script, cases)
    assert ref["version"] == "1.1.0", f"{python} imports giga_train {ref['version']}, not GigaTrain 1.1.0"
    ours = run_script(sys.executable, script, cases)
    assert ours["version"] != "1.1.0"
    return ref, ours
