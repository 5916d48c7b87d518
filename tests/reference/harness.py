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
SCENARIOS = ('main', 'resume', 'resume_epoch2', 'epochs_ema', 'disk', 'disk_bucket')


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
            # No PYTHONPATH: with this repository on it, setup.sh's final check imports our giga_train, not
            # GigaTrain's, fails, and the next call removes the venv to build it again.
            env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
            proc = subprocess.run(['bash', os.path.join(HERE, 'setup.sh'), venv], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env)
            if proc.returncode != 0 or not os.path.exists(stamp):
                raise RuntimeError('building the GigaTrain reference venv failed (exit %d):\n%s'
                                   % (proc.returncode, proc.stdout[-6000:]))
    return py


def record(scenario, workdir, python=None, timeout=600, allow_failure=False, giga_train_path=None):
    """Run one scenario of the client under `python` (default: the reference venv) and return its JSON.
    `allow_failure`: a phase that failed is in the JSON (its `ok` and `error`) instead of an exception.
    `giga_train_path`: a checkout whose `giga_train` the phases import first (ours, under the reference
    venv's Python: the giga_datasets scenarios)."""
    python = python or reference_python()
    workdir = os.path.abspath(str(workdir))
    os.makedirs(workdir, exist_ok=True)
    out = os.path.join(workdir, '%s.json' % scenario)
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'MASTER_ADDR', 'MASTER_PORT')}
    env.pop('RECORD_GIGA_TRAIN_PATH', None)
    if giga_train_path:
        env['RECORD_GIGA_TRAIN_PATH'] = giga_train_path
    proc = subprocess.run([python, RECORD, '--scenario', scenario, '--workdir', os.path.join(workdir, scenario),
                           '--out', out], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=env)
    if not os.path.exists(out) or (proc.returncode != 0 and not allow_failure):
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


SCALAR = (int, float, str, bool, type(None))


def comparable(doc):
    """The parts of a recorded JSON that two implementations should agree on, per phase and runner:
    hook sequence (depth, hook, step; `print` left out), per step the lr at its first micro-batch, the
    scheduler's last lr after it, the sample indices and total_loss of each micro-batch, the logged
    scalars, the properties whose values are plain scalars (types of wrappers differ by design), the
    Tester's results, and the checkpoint tree under models/ plus config.json."""
    out = []
    for phase in doc['phases']:
        runners = []
        for r in phase['runners']:
            runners.append(dict(
                runner=r['runner'],
                hooks=hook_sequence(r),
                lr=[s['lr'] for s in r['steps']],
                last_lr=[s['last_lr'] for s in r['steps']],
                indices=[[mb['indices'] for mb in s['micro_batches']] for s in r['steps']],
                total_loss=[[mb.get('total_loss') for mb in s['micro_batches']] for s in r['steps']],
                properties={when: {k: v for k, v in props.items() if isinstance(v, SCALAR)}
                            for when, props in r['properties'].items()},
                results=r['results'],
            ))
        out.append(dict(runners=runners, logged=phase['logged'],
                        tree=[p for p in phase['tree'] if p.startswith('models/') or p == 'config.json']))
    return out


def diff(expected, actual, rtol=1e-5, atol=1e-7, path='doc'):
    """Differences between two `comparable(...)` values as readable lines; floats within rtol/atol
    (losses: the two venvs run different torch builds), everything else exactly."""
    lines = []
    if isinstance(expected, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        if abs(expected - actual) > atol + rtol * abs(expected):
            lines.append('%s: %r != %r' % (path, expected, actual))
    elif isinstance(expected, dict) and isinstance(actual, dict):
        for k in sorted(set(expected) | set(actual), key=str):
            if k not in actual:
                lines.append('%s.%s: missing' % (path, k))
            elif k not in expected:
                lines.append('%s.%s: unexpected %r' % (path, k, actual[k]))
            else:
                lines += diff(expected[k], actual[k], rtol, atol, '%s.%s' % (path, k))
    elif isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        if len(expected) != len(actual):
            lines.append('%s: length %d != %d' % (path, len(expected), len(actual)))
        for i, (e, a) in enumerate(zip(expected, actual)):
            lines += diff(e, a, rtol, atol, '%s[%d]' % (path, i))
    elif expected != actual:
        lines.append('%s: %r != %r' % (path, expected, actual))
    return lines


if __name__ == '__main__':  # python -m tests.reference.harness [SCENARIO] : build, record, print the JSON path
    scenario = sys.argv[1] if len(sys.argv) > 1 else 'main'
    work = os.path.join('/tmp', 'gigatrain-ref-record')
    doc = record(scenario, work)
    print(os.path.join(work, '%s.json' % scenario))
