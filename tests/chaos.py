"""Chaos: the CPU char-LM demo (shrunk) under 2 DDP ranks, killed and preempted at random steps (a seeded
schedule), resumed each time; the final weights must equal an uninterrupted run's, bit for bit.

    python -m tests.chaos --events 10 --seed 1        (tests/test_chaos.py runs 3 events)

Events fire from inside the training (ChaosTrainer), at a step and phase, never after a sleep:
  kill_worker  one rank kills itself with SIGKILL; the elastic agent restarts both (max_restarts)
  kill_all     one rank SIGKILLs the launcher and every rank (a lost machine); the driver reruns
  sigterm      one rank sends SIGTERM to the launcher (preemption): exit 0; the driver reruns
Phases: "forward" (in the step's forward) or "save" (checkpoint half written: weights on disk)."""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time

import torch

from examples.char_lm.trainer import CharLMTrainer

KINDS = ("kill_worker", "kill_all", "sigterm")
MAX_STEPS, INTERVAL = 24, 4
OVERRIDES = [f"train.max_steps={MAX_STEPS}", f"train.checkpoint_interval={INTERVAL}", "train.log_interval=4",
             "train.checkpoint_total_limit=2", "train.resume=True", "train.log_with='none'",
             "train.progress_bar=False", "launch.distributed_type='DDP'", "launch.num_processes=2",
             "models.dim=32", "models.layers=2", "models.heads=2", "models.block_size=32",
             "dataloaders.train.data_or_config.block_size=32", "dataloaders.train.data_or_config.stride=32",
             "dataloaders.train.data_or_config.max_bytes=100000", "dataloaders.train.batch_size_per_gpu=8",
             "runners=['tests.chaos.ChaosTrainer']"]


def schedule(events, seed):
    """`events` distinct steps in 2..MAX_STEPS-2, each with a kind, a phase and the rank that acts."""
    rng = random.Random(seed)
    steps = sorted(rng.sample(range(2, MAX_STEPS - 1), events))
    return [dict(id=i, step=s, kind=rng.choice(KINDS), rank=rng.randrange(2),
                 phase="save" if s % INTERVAL == 0 and rng.random() < 0.5 else "forward")
            for i, s in enumerate(steps)]


class ChaosTrainer(CharLMTrainer):
    """Fires the events of GT_CHAOS (JSON) once each; a marker file in GT_CHAOS_DIR records that one fired."""

    def _event(self, step, phase):
        for event in json.loads(os.environ.get("GT_CHAOS", "[]")):
            marker = os.path.join(os.environ["GT_CHAOS_DIR"], f"fired_{event['id']}")
            if (event["step"], event["phase"], event["rank"]) == (step, phase, self.rank) \
                    and not os.path.exists(marker):
                with open(marker, "w") as f:
                    f.write(json.dumps(event))
                return event
        return None

    def _fire(self, event):
        if event["kind"] == "kill_worker":
            os.kill(os.getpid(), signal.SIGKILL)
        elif event["kind"] == "kill_all":
            os.kill(os.getppid(), signal.SIGKILL)
            results = os.environ["GIGA_TRAIN_RESULT_DIR"]
            for name in os.listdir(results):
                if name.startswith("pid_"):
                    with open(os.path.join(results, name)) as f:
                        pid = int(f.read())
                    if pid != os.getpid():
                        os.kill(pid, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        else:  # the agent passes SIGTERM on to both ranks; wait for ours, so the step is this one
            os.kill(os.getppid(), signal.SIGTERM)
            assert self.preemption.requested.wait(60), "SIGTERM never came back from the launcher"

    def forward_step(self, batch_dict):
        event = self._event(self.step + 1, "forward")
        if event:
            self._fire(event)
        return super().forward_step(batch_dict)

    def save_checkpoint(self):
        event = self._event(self.step, "save")
        if event:
            write_state = self.strategy.write_state

            def then_fire(folder, *args):
                write_state(folder, *args)
                self._fire(event)
            self.strategy.write_state = then_fire
        try:
            return super().save_checkpoint()
        finally:
            self.strategy.__dict__.pop("write_state", None)


def train(project, env=None, restarts=0):
    cmd = [sys.executable, "-m", "giga_train", "train", "examples/char_lm/configs/cpu.py",
           f"--set=project_dir='{project}'", f"--set=launch.max_restarts={restarts}"]
    cmd += [f"--set={o}" for o in OVERRIDES]
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def final_weights(project):
    from giga_train.checkpoint import list_checkpoints, read_weights
    checkpoints = list_checkpoints(os.path.join(project, "models"))
    if not checkpoints or checkpoints[-1][0] != MAX_STEPS:
        return None
    return read_weights(checkpoints[-1][1])


def run_chaos(workdir, events=3, seed=0, log=print):
    """Returns a summary; raises AssertionError when a run ends unexplained or the weights differ."""
    start = time.perf_counter()
    plan = schedule(events, seed)
    log(f"schedule: {plan}")
    reference = os.path.join(workdir, "reference")
    run = train(reference)
    assert run.returncode == 0, run.stderr[-3000:]
    expected = final_weights(reference)
    project, markers = os.path.join(workdir, "chaos"), os.path.join(workdir, "markers")
    os.makedirs(markers, exist_ok=True)
    env = {"GT_CHAOS": json.dumps(plan), "GT_CHAOS_DIR": markers}
    fired, runs = [], []
    for _ in range(events + 2):
        run = train(project, env, restarts=events)
        new = [json.loads(open(os.path.join(markers, f)).read()) for f in sorted(os.listdir(markers))
               if f not in {f"fired_{e['id']}" for e in fired}]
        fired += new
        runs.append(dict(returncode=run.returncode, fired=[f"{e['kind']}@{e['step']}/{e['phase']}" for e in new]))
        log(f"run {len(runs)}: exit {run.returncode}, fired {runs[-1]['fired']}")
        last = new[-1]["kind"] if new else None
        want = -signal.SIGKILL if last == "kill_all" else 0
        assert run.returncode == want, f"run {len(runs)} exit {run.returncode} after {new}:\n{run.stderr[-3000:]}"
        if final_weights(project) is not None and len(fired) == events:
            break
    assert len(fired) == events, f"only {len(fired)} of {events} events fired: {fired}"
    got = final_weights(project)
    assert got is not None, "the chaos run never finished"
    differ = [k for k in expected if not torch.equal(got[k], expected[k])]
    assert not differ, f"weights differ from the uninterrupted run: {differ[:5]}"
    return dict(events=plan, runs=runs, seconds=round(time.perf_counter() - start, 1))


def main():
    import tempfile
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="default: a temporary folder")
    args = parser.parse_args()
    if args.events > MAX_STEPS - 3:
        parser.error(f"--events: at most {MAX_STEPS - 3} (one per step)")
    workdir = args.workdir or tempfile.mkdtemp(prefix="giga_chaos_")
    summary = run_chaos(workdir, args.events, args.seed)
    print(json.dumps(summary, indent=1))
    print(f"ok: {args.events} events, {len(summary['runs'])} runs, final weights bit-identical ({summary['seconds']} s)")


if __name__ == "__main__":
    main()
