"""The reference side of the differential tests: build the GigaTrain 1.1.0 venv once, run the client.

    from tests.reference import harness
    py = harness.reference_python()                       # builds .venv-gigatrain on first use
    doc = harness.record('main', tmp_path)                # runs tests/reference/record.py under it
    doc = harness.record('main', tmp_path, python=sys.executable)   # the same client under ours

The venv is built by tests/reference/setup.sh from the package registry (never skipped: a test that
needs it builds it, as CI does on a fresh machine) and reused while its `.installed` stamp is newer
than setup.sh and constraints.txt. A file lock keeps two pytest processes from building it at once.
"""
import fcntl
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VENV = os.environ.get('GIGATRAIN_REF_VENV', os.path.join(ROOT, '.venv-gigatrain'))
RECORD = os.path.join(HERE, 'record.py')
SCENARIOS = ('main', 'resume', 'resume_epoch2', 'epochs_ema', 'disk')


def _stale(stamp):
    if not os.path.exists(stamp):
        return True
    built = os.path.getmtime(stamp)
    return any(os.path.getmtime(os.path.join(HERE, f)) > built for f in ('setup.sh', 'constraints.txt'))


def reference_python(venv=VENV):
    """The reference venv's python, building the venv first when it is missing or stale."""
    stamp = os.path.join(venv, '.installed')
    py = os.path.join(venv, 'bin', 'python')
    if not _stale(stamp):
        return py
    os.makedirs(os.path.dirname(venv) or '.', exist_ok=True)
    with open(venv.rstrip('/') + '.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stale(stamp):
            proc = subprocess.run(['bash', os.path.join(HERE, 'setup.sh'), venv], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            if proc.returncode != 0 or not os.path.exists(stamp):
                raise RuntimeError('building the GigaTrain reference venv failed (exit %d):\n%s'
                                   % (proc.returncode, proc.stdout[-6000:]))
    return py


def record(scenario, workdir, python=None, timeout=600):
    """Run one scenario of the client under `python` (default: the reference venv) and return its JSON."""
    python = python or reference_python()
    workdir = os.path.abspath(str(workdir))
    os.makedirs(workdir, exist_ok=True)
    out = os.path.join(workdir, '%s.json' % scenario)
    proc = subprocess.run([python, RECORD, '--scenario', scenario, '--workdir', os.path.join(workdir, scenario),
                           '--out', out], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'})
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError('recording %r under %s failed (exit %d):\n%s'
                           % (scenario, python, proc.returncode, proc.stdout[-6000:]))
    with open(out) as f:
        return json.load(f)


def trainer_run(doc, phase=-1):
    """The Trainer's runner record of a phase (the first runner whose name ends in Trainer)."""
    return next(r for r in doc['phases'][phase]['runners'] if r['runner'].endswith('Trainer'))


def hook_sequence(runner, skip=('print',)):
    """(depth, hook, step) of every recorded call, `print` left out by default."""
    return [(c['depth'], c['hook'], c['step']) for c in runner['calls'] if c['hook'] not in skip]


if __name__ == '__main__':  # python -m tests.reference.harness [SCENARIO] : build, record, print the JSON path
    scenario = sys.argv[1] if len(sys.argv) > 1 else 'main'
    work = os.path.join('/tmp', 'gigatrain-ref-record')
    doc = record(scenario, work)
    print(os.path.join(work, '%s.json' % scenario))
