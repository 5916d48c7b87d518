"""Run the tiny client project (tests/reference/ref_client) under whatever `giga_train` this Python
imports, and write what happened as JSON.

    python tests/reference/record.py --scenario main --workdir DIR --out FILE.json

Run it with the reference venv's Python (.venv-gigatrain/bin/python) for the real GigaTrain 1.1.0,
or with ours. The working directory is set to DIR, never the repository root (our own giga_train/
there would shadow the reference's). The client is the same in both; nothing here is specific to one
implementation beyond reading public names (`giga_train.__version__`, optionally
`giga_train.distributed.run_tasks`). The JSON is meant to be compared field by field (SCHEMA below).

Each scenario is one or more *phases*; each phase runs in a fresh subprocess (as a relaunched job
would) on the same project folder, with the config's runners in order, as GigaTrain's run_tasks does
(giga_train/distributed/run_task.py:16-39 in 1.1.0): Runner.load(config) -> runner.print(config) ->
Trainer: save_config(config), resume() if train.resume, train(); Tester: test().
"""
import argparse
import copy
import enum
import functools
import json
import math
import os
import re
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA_VERSION = 1

# What the JSON holds (one file per scenario):
# {
#   "schema": 1, "scenario": str, "implementation": {"giga_train": version, "torch": version, "entry": str},
#   "phases": [ {                       # one per subprocess
#       "config": {...},                # the config dict given to the runners (paths relativised)
#       "ok": bool, "error": str|null,
#       "runners": [ {
#           "runner": "ref_client.trainer.RefTrainer",
#           "calls": [ {"hook": str, "depth": int, "step": int|null, "args": {...}, "returned": ...} ],
#           "properties": {"after_load": {...}, "after_run": {...}},
#           "steps": [ {"step": s, "lr": [[group lrs] per optimizer] at the step's first micro-batch,
#                       "last_lr": [scheduler.get_last_lr() per scheduler] after the step,
#                       "micro_batches": [ {"indices": [...], "losses": {name: mean}, "total_loss": float,
#                                          "loss": float} ] } ],
#           "results": [...] (a Tester's self.results), } ],
#       "logged": {tag: [[step, value], ...]},      # TensorBoard scalars under logging_dir
#       "log_lines": [...],                          # Step[...]/Epoch[...] lines of the text logs, times masked
#       "tree": [...],                               # every path under project_dir, names normalised
#   } ]
# }

TRAINER_HOOKS = [
    'load', 'prepare', 'get_dataloaders', 'get_models', 'set_ema_models', 'apply_activation_checkpointing',
    'apply_fp8', 'get_optimizers', 'get_schedulers', 'train', 'forward_step', 'parse_losses', 'backward_step',
    'print_before_train', 'print_step', 'print_after_train', 'save_checkpoint_step', 'save_model_hook',
    'load_model_hook', 'resume', 'get_checkpoint', 'load_checkpoint', 'remove_checkpoint', 'save_config',
    'state_dict', 'load_state_dict', 'print',
]
TESTER_HOOKS = [
    'load', 'prepare', 'get_dataloaders', 'get_models', 'get_checkpoint', 'test', 'print_before_test',
    'print_step', 'print_after_test', 'print',
]
TRAINER_PROPERTIES = [
    'project_dir', 'logging_dir', 'model_dir', 'distributed_type', 'num_processes', 'process_index',
    'local_process_index', 'is_main_process', 'is_local_main_process', 'is_last_process', 'device', 'dtype',
    'mixed_precision', 'gradient_accumulation_steps', 'dataloaders', 'dataloader', 'models', 'model',
    'optimizers', 'optimizer', 'schedulers', 'scheduler', 'data_size', 'batch_size', 'epoch_size',
    'max_epochs', 'max_steps', 'cur_epoch', 'cur_step', 'kwargs', 'logger', 'print',
]
TESTER_PROPERTIES = [
    'project_dir', 'logging_dir', 'model_dir', 'distributed_type', 'num_processes', 'process_index',
    'local_process_index', 'is_main_process', 'is_local_main_process', 'is_last_process', 'device', 'dtype',
    'mixed_precision', 'dataloaders', 'dataloader', 'models', 'model', 'data_size', 'batch_size',
    'epoch_size', 'cur_step', 'kwargs', 'logger', 'print',
]


# ----------------------------------------------------------------------------------------- scenarios
def base_config(project_dir):
    data = dict(_class_name='TinyRegression', size=22, dim=4, seed=0)
    return dict(
        project_dir=project_dir,
        runners=['ref_client.trainer.RefTrainer', 'ref_client.tester.RefTester'],
        launch=dict(distributed_type='NO'),  # one process on the CPU (run_tasks reads no launch key)
        dataloaders=dict(
            train=dict(data_or_config=data, batch_size_per_gpu=4, num_workers=0, transform=None,
                       sampler=dict(type='DefaultSampler', shuffle=True)),
            test=dict(data_or_config=dict(data, size=10, seed=1), batch_size_per_gpu=4, num_workers=0, transform=None),
        ),
        models=dict(in_dim=4, hidden=8),
        optimizers=dict(type='AdamW', lr=0.01, weight_decay=0.01),
        schedulers=dict(type='WarmupCosineScheduler', warmup_steps=2, decay_steps=6, start_value=1.0, end_value=0.1),
        train=dict(
            max_steps=8,
            gradient_accumulation_steps=1,
            log_with='tensorboard',
            log_interval=1,
            checkpoint_interval=3,
            checkpoint_total_limit=2,
            max_grad_norm=1.0,      # not a Trainer keyword: reaches self.kwargs (read by backward_step)
            aux_weight=0.01,        # the client's own extra key: reaches self.kwargs
        ),
        test=dict(log_interval=1),
    )


def scenario_phases(name, project_dir):
    """The configs, one per subprocess."""
    cfg = base_config(project_dir)
    if name == 'main':
        # 8 steps over 22 samples in global batches of 4 (6 batches an epoch, the last padded), one
        # AdamW over both models, WarmupCosine, checkpoints at 3, 6, 8 with total_limit 2; then the Tester.
        return [cfg]
    if name == 'resume':
        # 4 steps, stop (mid-epoch), relaunch with resume=True to 8: steps 5..8 compare with 'main'.
        first = copy.deepcopy(cfg)
        first['runners'] = first['runners'][:1]
        first['train']['max_steps'] = 4
        second = copy.deepcopy(cfg)
        second['train']['resume'] = True
        return [first, second]
    if name == 'resume_epoch2':
        # stop after 7 steps (the first step of the 2nd epoch), resume to 8: GigaTrain 1.1 replays the
        # first epoch's order here (Accelerate's DataLoaderShard.__iter__ resets the sampler's epoch to 0
        # after Trainer.resume set it), a known defect; compare step 8 with 'main'.
        first = copy.deepcopy(cfg)
        first['runners'] = first['runners'][:1]
        first['train']['max_steps'] = 7
        second = copy.deepcopy(cfg)
        second['runners'] = second['runners'][:1]
        second['train']['resume'] = True
        return [first, second]
    if name == 'disk':
        # giga_datasets' own data path: two PklDataset folders on disk as a list (a ConcatDataset of
        # 12 + 10 samples), `filter` (each child cut to its first 10), a TRANSFORMS transform, the
        # collator's keyword, DefaultSampler with its own seed; the Tester reads one folder by path.
        from ref_client.data import write_pkl_dataset

        data_dir = os.path.join(os.path.dirname(project_dir), 'data')
        if not os.path.exists(os.path.join(data_dir, 'done')):
            write_pkl_dataset(os.path.join(data_dir, 'part_a'), size=12, seed=0, start=0)
            write_pkl_dataset(os.path.join(data_dir, 'part_b'), size=10, seed=0, start=12)
            write_pkl_dataset(os.path.join(data_dir, 'test'), size=10, seed=1)
            open(os.path.join(data_dir, 'done'), 'w').close()
        cfg['dataloaders']['train'] = dict(
            data_or_config=[os.path.join(data_dir, 'part_a'), os.path.join(data_dir, 'part_b')],
            filter=dict(mode='index', start=0, end=10), transform=dict(type='ScaleX', factor=0.5),
            collator=dict(is_equal=True), sampler=dict(type='DefaultSampler', shuffle=True, seed=7),
            batch_size_per_gpu=4, num_workers=0)
        cfg['dataloaders']['test'] = dict(data_or_config=os.path.join(data_dir, 'test'), batch_size_per_gpu=4,
                                          num_workers=0, transform=dict(type='ScaleX', factor=0.5))
        cfg['train'].update(max_steps=6, checkpoint_interval=6)
        return [cfg]
    if name == 'disk_bucket':
        # giga_datasets' BucketSampler on two `Dataset` folders (a ConcatDataset of 12 + 10 samples in 3
        # buckets), each bucket padded to whole global batches and the batches shuffled across buckets.
        from ref_client.data import write_bucketed_dataset

        data_dir = os.path.join(os.path.dirname(project_dir), 'data')
        if not os.path.exists(os.path.join(data_dir, 'done')):
            write_bucketed_dataset(os.path.join(data_dir, 'part_a'), size=12, start=0)
            write_bucketed_dataset(os.path.join(data_dir, 'part_b'), size=10, start=12)
            open(os.path.join(data_dir, 'done'), 'w').close()
        cfg['runners'] = cfg['runners'][:1]
        cfg['dataloaders']['train'] = dict(
            data_or_config=[os.path.join(data_dir, 'part_a'), os.path.join(data_dir, 'part_b')],
            sampler=dict(type='BucketSampler', seed=7), batch_size_per_gpu=4, num_workers=0, transform=None)
        cfg['train'].update(max_steps=9, checkpoint_interval=9)
        return [cfg]
    if name == 'epochs_ema':
        # by epochs, accumulation 2, EMA, safetensors, optimizer state kept in the newest only,
        # checkpoint_interval in epochs (a fraction), keeps by epoch, no total limit (-1).
        cfg['runners'] = cfg['runners'][:1]
        train = cfg['train']
        del train['max_steps']
        train.update(max_epochs=2, gradient_accumulation_steps=2, with_ema=True, checkpoint_safe_serialization=True,
                     checkpoint_save_optimizer=False, checkpoint_interval=0.5, checkpoint_total_limit=-1,
                     checkpoint_keeps=[1], seed=1234, log_interval=2)
        cfg['schedulers'] = dict(type='LinearScheduler', start_value=1.0, end_value=0.0)
        return [cfg]
    if name in ('keep_all', 'keep_all_came8bit'):
        # 'main' without the Tester, every checkpoint kept (3, 6, 8): the uninterrupted run and, at step 3
        # (mid-epoch), the folder another implementation resumes from (--resume-from). CAME8Bit's first moment
        # of the 32-element encoder weight is 8-bit in both (min_8bit_size=16).
        cfg['runners'] = cfg['runners'][:1]
        cfg['train']['checkpoint_total_limit'] = -1
        if name == 'keep_all_came8bit':
            cfg['optimizers'] = dict(type='CAME8Bit', lr=0.01, weight_decay=0.01, min_8bit_size=16)
        return [cfg]
    raise SystemExit('unknown scenario %r' % name)


SCENARIOS = ['main', 'resume', 'resume_epoch2', 'epochs_ema', 'disk', 'disk_bucket', 'keep_all',
             'keep_all_came8bit']


# ----------------------------------------------------------------------------------------- summaries
class Ctx:
    roots = []          # (path, placeholder) pairs, longest first


def rel(s):
    for path, mark in Ctx.roots:
        if s.startswith(path):
            return mark + s[len(path):]
    return s


def summ(v, depth=0):
    import torch

    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, str):
        return rel(v)
    if isinstance(v, enum.Enum):
        return summ(v.value, depth)
    if isinstance(v, torch.Tensor):
        out = dict(tensor=list(v.shape), dtype=str(v.dtype).replace('torch.', ''))
        if v.numel() == 1:
            out['value'] = float(v.detach().float().item())
        return out
    if isinstance(v, (torch.device, torch.dtype)):
        return str(v)
    if isinstance(v, torch.nn.Module):
        out = dict(module=type(v).__name__)
        if hasattr(v, 'keys') and callable(v.keys):
            out['keys'] = list(v.keys())
        return out
    if isinstance(v, torch.optim.Optimizer):
        return dict(optimizer=type(v).__name__, lr=[g['lr'] for g in v.param_groups])
    if isinstance(v, torch.utils.data.DataLoader):
        return dict(dataloader=type(v).__name__, len=len(v), dataset=type(v.dataset).__name__)
    if hasattr(v, 'get_last_lr') and hasattr(v, 'step'):
        return dict(scheduler=type(v).__name__)
    if isinstance(v, dict):
        if depth >= 2:
            return dict(dict_keys=sorted(map(str, v.keys())))
        return {str(k): (index_list(x) if k == 'index' else summ(x, depth + 1)) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        items = [summ(x, depth + 1) for x in list(v)[:16]]
        if len(v) > 16:
            items.append('... %d more' % (len(v) - 16))
        return items
    if callable(v):
        return dict(callable=getattr(v, '__name__', type(v).__name__))
    return dict(type=type(v).__name__)


def index_list(v):
    import torch

    if isinstance(v, torch.Tensor):
        return [int(i) for i in v.reshape(-1).tolist()]
    return [int(i) for i in v]


def prop_value(obj, name):
    import logging

    try:
        v = getattr(obj, name)
    except Exception as e:  # a property that raises is a fact too
        return dict(error=type(e).__name__)
    if isinstance(v, logging.Logger):
        return dict(logger=type(v).__name__, name=v.name)
    if name == 'print':
        return dict(callable='print')
    if name in ('dataloaders', 'models', 'optimizers', 'schedulers'):
        return [summ(x) for x in v]
    return summ(v)


# ------------------------------------------------------------------------------------------ recording
class Recorder:
    def __init__(self):
        self.runners = []       # one dict per runner instance
        self.depth = 0
        self.cur = None         # the runner dict being filled

    def new_runner(self, name):
        self.cur = dict(runner=name, calls=[], properties={}, steps=[], results=None)
        self.runners.append(self.cur)
        return self.cur

    def step_of(self, obj):
        try:
            return int(obj.cur_step)
        except Exception:
            return None


REC = Recorder()


def wrap_class(cls, hooks, properties, runner_name):
    for name in hooks:
        if not hasattr(cls, name):
            continue
        if name == 'load':
            orig = getattr(cls, 'load').__func__

            def load(klass, *args, _orig=orig, **kwargs):
                REC.new_runner(runner_name)
                ev = dict(hook='load', depth=REC.depth, step=None, args=summ(dict(args=list(args), kwargs=kwargs)))
                REC.cur['calls'].append(ev)
                REC.depth += 1
                try:
                    runner = _orig(klass, *args, **kwargs)
                finally:
                    REC.depth -= 1
                ev['returned'] = dict(type=type(runner).__name__)
                REC.cur['properties']['after_load'] = {p: prop_value(runner, p) for p in properties}
                return runner

            setattr(cls, 'load', classmethod(load))
            continue
        orig = getattr(cls, name)

        def method(self, *args, _orig=orig, _name=name, **kwargs):
            ev = dict(hook=_name, depth=REC.depth, step=REC.step_of(self),
                      args=summ(dict(args=list(args), kwargs=kwargs)) if _name != 'print' else None)
            if REC.cur is not None:
                REC.cur['calls'].append(ev)
            before = observe_before(self, _name, args)
            REC.depth += 1
            try:
                out = _orig(self, *args, **kwargs)
            finally:
                REC.depth -= 1
            if _name != 'print':
                ev['returned'] = summ(out)
            observe_after(self, _name, args, out, before)
            return out

        functools.update_wrapper(method, orig)
        setattr(cls, name, method)


def lrs(runner):
    try:
        return [[g['lr'] for g in opt.param_groups] for opt in runner.optimizers]
    except Exception:
        return None


def observe_before(runner, name, args):
    steps = REC.cur['steps'] if REC.cur is not None else None
    if name == 'forward_step' and steps is not None:
        step = REC.step_of(runner)
        if not steps or steps[-1]['step'] != step:
            steps.append(dict(step=step, lr=lrs(runner), last_lr=None, micro_batches=[]))
        batch = args[0] if args else None
        mb = dict(indices=index_list(batch['index']) if isinstance(batch, dict) and 'index' in batch else None)
        steps[-1]['micro_batches'].append(mb)
    if name == 'parse_losses' and args:
        import torch

        losses = args[0]
        if isinstance(losses, dict):  # read before parse_losses replaces the entries by their means
            means = {k: float(v.detach().float().mean()) for k, v in losses.items()}
            return dict(losses=means, total_loss=sum(means.values()))
        if isinstance(losses, torch.Tensor):
            m = float(losses.detach().float().mean())
            return dict(losses={}, total_loss=m)
    return None


def observe_after(runner, name, args, out, before):
    steps = REC.cur['steps'] if REC.cur is not None else None
    if name == 'parse_losses' and steps and steps[-1]['micro_batches'] and before is not None:
        mb = steps[-1]['micro_batches'][-1]
        mb.update(before)
        try:
            mb['loss'] = float(out.detach().float())
        except Exception:
            mb['loss'] = summ(out)
    if name == 'print_step' and steps:
        try:
            steps[-1]['last_lr'] = [list(map(float, s.get_last_lr())) for s in runner.schedulers]
        except Exception as e:
            steps[-1]['last_lr'] = dict(error=type(e).__name__)
    if name in ('train', 'test'):
        props = TRAINER_PROPERTIES if name == 'train' else TESTER_PROPERTIES
        REC.cur['properties']['after_run'] = {p: prop_value(runner, p) for p in props}
        if name == 'test':
            res = getattr(runner, 'results', None)
            REC.cur['results'] = [float(r) for r in res] if res is not None else None


# ---------------------------------------------------------------------------------------- after a run
def files_under(d):
    return {os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs} if os.path.isdir(d) else set()


def read_scalars(logging_dir, skip=()):
    """The scalars of the event files not in `skip` (those an earlier phase wrote)."""
    out = {}
    if not os.path.isdir(logging_dir):
        return out
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return dict(error='tensorboard not installed')
    for root, _, files in sorted(os.walk(logging_dir)):
        if not any(f.startswith('events.out.tfevents') and os.path.join(root, f) not in skip for f in files):
            continue
        acc = EventAccumulator(root, size_guidance={'scalars': 0, 'tensors': 0})
        acc.Reload()
        tags = acc.Tags()
        for tag in tags.get('scalars', []):
            out.setdefault(tag, []).extend([e.step, e.value] for e in acc.Scalars(tag))
        for tag in tags.get('tensors', []):  # torch's SummaryWriter may write scalars as tensors
            import numpy as np
            from tensorboard.util import tensor_util

            for e in acc.Tensors(tag):
                arr = np.asarray(tensor_util.make_ndarray(e.tensor_proto))
                if arr.size == 1 and arr.dtype.kind in 'biuf':  # not text (ours writes the config as text)
                    out.setdefault(tag, []).append([e.step, float(arr.reshape(-1)[0])])
    for tag in out:
        out[tag].sort()
    return out


TIME_RE = re.compile(r'\d{4}-\d{2}-\d{2}-\d{6}')


def norm_name(name):
    name = TIME_RE.sub('<time>', name)
    if name.startswith('events.out.tfevents'):
        return 'events.out.tfevents.<id>'
    return name


def tree(project_dir):
    out = []
    for root, dirs, files in os.walk(project_dir):
        dirs.sort()
        r = os.path.relpath(root, project_dir)
        parts = [] if r == '.' else [norm_name(p) for p in r.split(os.sep)]
        for d in dirs:
            out.append('/'.join(parts + [norm_name(d)]) + '/')
        for f in files:
            out.append('/'.join(parts + [norm_name(f)]))
    return sorted(set(out))


STEP_LINE = re.compile(r'(Step\[|Epoch\[)')


def log_lines(logging_dir, skip=()):
    lines = []
    if not os.path.isdir(logging_dir):
        return lines
    for f in sorted(os.listdir(logging_dir)):
        if not f.endswith('.log') or os.path.join(logging_dir, f) in skip:
            continue
        for line in open(os.path.join(logging_dir, f), errors='replace'):
            if STEP_LINE.search(line):
                line = line.rstrip('\n')
                line = re.sub(r'^\S+ \S+ ', '', line)                   # the asctime prefix
                line = re.sub(r'eta: [^,]*', 'eta: <t>', line)
                line = re.sub(r'time: [0-9.]+', 'time: <t>', line)
                line = re.sub(r'speed: [0-9.]+', 'speed: <s>', line)
                line = re.sub(r'cpu_mem: [^,]*', 'cpu_mem: <m>', line)
                lines.append(line)
    return lines


# ------------------------------------------------------------------------------------------- a phase
def run_phase(config, out_path):
    """In this process: patch the client, run the runners as run_tasks does, write the phase JSON."""
    import giga_train
    import torch

    from ref_client.tester import RefTester
    from ref_client.trainer import RefTrainer

    wrap_class(RefTrainer, TRAINER_HOOKS, TRAINER_PROPERTIES, 'ref_client.trainer.RefTrainer')
    wrap_class(RefTester, TESTER_HOOKS, TESTER_PROPERTIES, 'ref_client.tester.RefTester')
    try:
        from giga_train.distributed import run_tasks
        entry = 'giga_train.distributed.run_tasks'
    except ImportError:
        run_tasks, entry = None, 'record.run_like_run_tasks'
    result = dict(implementation=dict(giga_train=getattr(giga_train, '__version__', None), torch=torch.__version__,
                                      entry=entry),
                  config=summ(config, depth=-10), ok=True, error=None)
    try:
        if run_tasks is not None:
            run_tasks(copy.deepcopy(config))
        else:
            run_like_run_tasks(copy.deepcopy(config))
    except BaseException as e:  # SystemExit included: GigaTrain calls exit(-1) past loss_nan_total_limit
        result.update(ok=False, error='%s: %s' % (type(e).__name__, e))
        traceback.print_exc()
    result['runners'] = REC.runners
    with open(out_path, 'w') as f:
        json.dump(result, f, indent=1, sort_keys=False, default=str)


def run_like_run_tasks(config):
    """GigaTrain 1.1's run_tasks through public names only, for an implementation without
    giga_train.distributed.run_tasks (giga_train/distributed/run_task.py:16-39)."""
    from giga_train import Tester, Trainer, load_config

    config = load_config(config)
    for name in config.runners:
        module, cls = name.rsplit('.', 1)
        runner = getattr(__import__(module, fromlist=[cls]), cls).load(config)
        runner.print(config)
        if isinstance(runner, Trainer):
            runner.save_config(config)
            if config.train.get('resume', False):
                runner.resume()
            runner.train()
        elif isinstance(runner, Tester):
            runner.test()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--scenario', required=True, choices=SCENARIOS)
    ap.add_argument('--workdir', required=True)
    ap.add_argument('--out', required=True)
    ap.add_argument('--phase', type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument('--resume-from', default=None, help='a checkpoint folder copied into the project\'s models/'
                    ' before the first phase; every phase resumes (train.resume=True), as a job moved here')
    args = ap.parse_args()
    workdir = os.path.abspath(args.workdir)
    project_dir = os.path.join(workdir, 'project')
    Ctx.roots = [(project_dir, '<project>'), (workdir, '<work>'), (HERE, '<reference>')]
    sys.path.insert(0, HERE)
    phases = scenario_phases(args.scenario, project_dir)
    for cfg in phases if args.resume_from else ():
        cfg['train']['resume'] = True
    if args.phase is not None:  # the child: one phase, in this process
        os.chdir(workdir)
        run_phase(phases[args.phase], args.out)
        return
    os.makedirs(workdir, exist_ok=True)
    if args.resume_from:
        import shutil
        source = os.path.abspath(args.resume_from)
        shutil.copytree(source, os.path.join(project_dir, 'models', os.path.basename(source)))
    env = dict(os.environ)
    env.pop('PYTHONPATH', None)           # nothing of the caller's (our repository) on the path ...
    if os.environ.get('RECORD_GIGA_TRAIN_PATH'):  # ... but ours: the checkout under test (harness._environment)
        env['PYTHONPATH'] = os.environ['RECORD_GIGA_TRAIN_PATH']
    env.pop('AIHC_TENSORBOARD_LOG_PATH', None)
    env.setdefault('CUDA_VISIBLE_DEVICES', '')
    env.setdefault('OMP_NUM_THREADS', '1')
    env.setdefault('TOKENIZERS_PARALLELISM', 'false')
    doc = dict(schema=SCHEMA_VERSION, scenario=args.scenario, phases=[])
    for i in range(len(phases)):
        phase_out = os.path.join(workdir, 'phase_%d.json' % i)
        logging_dir = os.path.join(project_dir, 'logs')
        before = files_under(logging_dir)
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), '--scenario', args.scenario,
                               '--workdir', workdir, '--out', phase_out, '--phase', str(i)]
                              + (['--resume-from', os.path.abspath(args.resume_from)] if args.resume_from else []),
                              cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with open(os.path.join(workdir, 'phase_%d.out' % i), 'w') as f:
            f.write(proc.stdout)
        if not os.path.exists(phase_out):
            raise SystemExit('phase %d wrote no JSON (exit %d); its output ends:\n%s'
                             % (i, proc.returncode, proc.stdout[-4000:]))
        phase = json.load(open(phase_out))
        phase['exit_code'] = proc.returncode
        phase['logged'] = read_scalars(logging_dir, before)
        phase['log_lines'] = log_lines(logging_dir, before)
        phase['tree'] = tree(project_dir)
        doc['implementation'] = phase.pop('implementation')
        doc['phases'].append(phase)
    with open(args.out, 'w') as f:
        json.dump(doc, f, indent=1)
    bad = [i for i, p in enumerate(doc['phases']) if not p['ok'] or p['exit_code'] != 0]
    if bad:
        raise SystemExit('phase(s) %s failed: %s (see %s/phase_*.out)'
                         % (bad, [doc['phases'][i]['error'] for i in bad], workdir))


if __name__ == '__main__':
    main()
