"""The reference harness works: the real GigaTrain 1.1.0 (built from the registry in its own venv by
tests/reference/setup.sh on first use) runs the tiny client, and the JSON it writes has the structure
the differential tests compare, with the values GigaTrain 1.1.0 is known to give (docs/GIGATRAIN.md).

These tests check the *reference* and the recorder, not our package; the comparison with ours lives
with our API."""
import math

import pytest

from tests.reference import harness


def test_structure(reference_docs):
    for scenario, doc in reference_docs.items():
        assert doc['schema'] == 1 and doc['scenario'] == scenario
        assert doc['implementation']['giga_train'] == '1.1.0'
        for phase in doc['phases']:
            assert phase['ok'] and phase['exit_code'] == 0, phase['error']
            assert set(phase) >= {'config', 'runners', 'logged', 'log_lines', 'tree'}
            for runner in phase['runners']:
                assert set(runner) == {'runner', 'calls', 'properties', 'steps', 'results'}
                assert set(runner['properties']) == {'after_load', 'after_run'}
                for call in runner['calls']:
                    assert set(call) >= {'hook', 'depth', 'step', 'args'}


def expected_warmup_cosine(k, warmup=2, decay=6, start=1.0, end=0.1):
    # giga_train/schedulers/schedulers.py:148-161 (1.1.0), under LambdaLR: step k runs at value(k - 1)
    n = k - 1
    if n == 0:
        return start / (warmup + 1)
    if n <= warmup:
        return start * n / warmup
    if n <= decay:
        f = 0.5 * (1 + math.cos(math.pi * (n - warmup) / (decay - warmup)))
        return start * f + end * (1 - f)
    return end


def test_main_run(reference_docs):
    doc = reference_docs['main']
    trainer = harness.trainer_run(doc)
    # hooks: load -> prepare -> (get_dataloaders, get_models, set_ema_models, apply_activation_checkpointing,
    # apply_fp8, get_optimizers, get_schedulers) -> save_config -> train -> per step forward/parse/backward,
    # print_step, save_checkpoint_step (remove_checkpoint, save_model_hook, state_dict at a save)
    seq = harness.hook_sequence(trainer)
    assert seq[:9] == [(0, 'load', None), (1, 'prepare', 0), (2, 'get_dataloaders', 0), (2, 'get_models', 0),
                       (2, 'set_ema_models', 0), (2, 'apply_activation_checkpointing', 0), (2, 'apply_fp8', 0),
                       (2, 'get_optimizers', 0), (2, 'get_schedulers', 0)]
    assert seq[9:12] == [(0, 'save_config', 0), (0, 'train', 0), (1, 'print_before_train', 0)]
    assert seq[12:17] == [(1, 'forward_step', 1), (1, 'parse_losses', 1), (1, 'backward_step', 1),
                          (1, 'print_step', 1), (1, 'save_checkpoint_step', 1)]
    assert [(h, s) for d, h, s in seq[10:] if d == 2] == [(h, s) for s in (3, 6, 8)
                                                    for h in ('remove_checkpoint', 'save_model_hook', 'state_dict')]
    assert seq[-1] == (1, 'print_after_train', 8)
    # lr: exact WarmupCosine through LambdaLR
    steps = trainer['steps']
    assert [s['step'] for s in steps] == list(range(1, 9))
    for s in steps:
        assert s['lr'] == [[pytest.approx(0.01 * expected_warmup_cosine(s['step']), rel=1e-12)]]
    # per-sample losses: each entry's mean, summed; logged per step as total_loss (log_interval 1)
    logged = dict(map(tuple, doc['phases'][0]['logged']['total_loss']))
    for s in steps:
        (mb,) = s['micro_batches']
        assert len(mb['indices']) == 4
        assert mb['total_loss'] == pytest.approx(mb['losses']['mse'] + mb['losses']['aux'], rel=1e-6)
        assert logged[s['step']] == pytest.approx(mb['total_loss'], rel=1e-6)
    # DefaultSampler: 22 samples padded to 24 per epoch; an epoch of 6 steps sees every sample
    first_epoch = [i for s in steps[:6] for i in s['micro_batches'][0]['indices']]
    assert sorted(set(first_epoch)) == list(range(22)) and len(first_epoch) == 24
    props = trainer['properties']['after_load']
    assert props['data_size'] == 22 and props['batch_size'] == 4 and props['epoch_size'] == 6
    assert props['max_steps'] == 8 and props['max_epochs'] == 2 and props['cur_step'] == 0
    assert props['distributed_type'] == 'NO' and props['kwargs'] == {'max_grad_norm': 1.0, 'aux_weight': 0.01}
    assert trainer['properties']['after_run']['cur_step'] == 8
    tree = doc['phases'][0]['tree']
    for ckpt in ('checkpoint_epoch_1_step_6', 'checkpoint_epoch_2_step_8'):
        for f in ('encoder/config.json', 'encoder/diffusion_pytorch_model.bin', 'head/config.json',
                  'head/diffusion_pytorch_model.bin', 'optimizer.bin', 'scheduler.bin', 'random_states_0.pkl',
                  'custom_checkpoint_0.pkl'):
            assert 'models/%s/%s' % (ckpt, f) in tree
    assert not any('step_3' in p for p in tree)          # checkpoint_total_limit=2
    assert 'config.json' in tree
    tester = doc['phases'][0]['runners'][1]
    assert tester['runner'].endswith('RefTester') and len(tester['results']) == 10


def test_resume_continues_the_run(reference_docs):
    main = harness.trainer_run(reference_docs['main'])['steps']
    resumed = harness.trainer_run(reference_docs['resume'], phase=1)
    assert [s['step'] for s in resumed['steps']] == [5, 6, 7, 8]
    for a, b in zip(main[4:], resumed['steps']):
        assert a['lr'] == b['lr']
        assert a['micro_batches'][0]['indices'] == b['micro_batches'][0]['indices']
        assert b['micro_batches'][0]['total_loss'] == pytest.approx(a['micro_batches'][0]['total_loss'], rel=1e-6)
    hooks = [h for _, h, _ in harness.hook_sequence(resumed)]
    assert hooks[hooks.index('save_config'):hooks.index('train')] == [
        'save_config', 'resume', 'get_checkpoint', 'load_model_hook', 'load_state_dict']


def test_epochs_ema_layout(reference_docs):
    doc = reference_docs['epochs_ema']
    trainer = harness.trainer_run(doc)
    props = trainer['properties']['after_load']
    assert props['epoch_size'] == 3 and props['max_steps'] == 6 and props['batch_size'] == 8
    assert all(len(s['micro_batches']) == 2 for s in trainer['steps'])
    tree = doc['phases'][0]['tree']
    names = sorted({p.split('/')[1] for p in tree if p.startswith('models/checkpoint')})
    assert names == ['checkpoint_epoch_1_step_1', 'checkpoint_epoch_1_step_2', 'checkpoint_epoch_1_step_3',
                     'checkpoint_epoch_2_step_4', 'checkpoint_epoch_2_step_5', 'checkpoint_epoch_2_step_6']
    for name in names:
        for f in ('ema_config.json', 'model.safetensors', 'encoder_ema/config.json',
                  'encoder_ema/diffusion_pytorch_model.safetensors', 'head_ema/diffusion_pytorch_model.safetensors'):
            assert 'models/%s/%s' % (name, f) in tree
        assert 'models/%s/encoder/' % name not in tree
    # checkpoint_save_optimizer=False: optimizer.bin dropped from all but the newest two, except kept epochs
    with_optimizer = sorted(n for n in names if 'models/%s/optimizer.bin' % n in tree)
    assert with_optimizer == ['checkpoint_epoch_1_step_1', 'checkpoint_epoch_1_step_2', 'checkpoint_epoch_1_step_3',
                              'checkpoint_epoch_2_step_5', 'checkpoint_epoch_2_step_6']
    assert [s for s, _ in doc['phases'][0]['logged']['total_loss']] == [2, 4, 6]


def test_resume_in_a_later_epoch_replays_the_first_epoch(reference_docs):
    # A defect of the reference, recorded so that the differential test can state our difference:
    # Trainer.resume sets the sampler's epoch, then Accelerate's DataLoaderShard.__iter__ sets it back to 0.
    main = harness.trainer_run(reference_docs['main'])['steps']
    resumed = harness.trainer_run(reference_docs['resume_epoch2'], phase=1)['steps']
    assert [s['step'] for s in resumed] == [8]
    assert resumed[0]['lr'] == main[7]['lr']
    assert resumed[0]['micro_batches'][0]['indices'] == main[1]['micro_batches'][0]['indices']   # epoch 1's 2nd batch
    assert resumed[0]['micro_batches'][0]['indices'] != main[7]['micro_batches'][0]['indices']


def test_disk_data_path(reference_docs):
    # giga_datasets' path: a list of two PklDataset folders -> ConcatDataset, filter, transform, collator
    doc = reference_docs['disk']
    trainer = harness.trainer_run(doc)
    props = trainer['properties']['after_load']
    assert props['data_size'] == 20 and props['epoch_size'] == 5
    first_epoch = [i for s in trainer['steps'][:5] for i in s['micro_batches'][0]['indices']]
    assert sorted(first_epoch) == list(range(10)) + list(range(12, 22))   # each child cut to its first 10
    tester = doc['phases'][0]['runners'][1]
    assert tester['properties']['after_load']['data_size'] == 10 and len(tester['results']) == 10


def test_disk_bucket_data_path(reference_docs):
    # giga_datasets' BucketSampler: buckets (index % 3: 8, 7, 7 samples) padded to whole global batches of 4,
    # each batch from one bucket, 6 batches an epoch covering every sample
    trainer = harness.trainer_run(reference_docs['disk_bucket'])
    batches = [s['micro_batches'][0]['indices'] for s in trainer['steps']]
    assert trainer['properties']['after_load']['epoch_size'] == 6 and len(batches) == 9
    assert all(len({i % 3 for i in batch}) == 1 for batch in batches)
    assert set(i for batch in batches[:6] for i in batch) == set(range(22))


def test_comparable_and_diff(reference_docs):
    import copy

    view = harness.comparable(reference_docs['main'])
    assert harness.diff(view, view) == []
    other = copy.deepcopy(view)
    trainer = other[0]['runners'][0]
    trainer['lr'][3][0][0] *= 1.001                       # lr compares to rtol 1e-5: found
    trainer['total_loss'][2][0] *= 1 + 1e-7               # a loss within tolerance: not reported
    trainer['hooks'][5] = (2, 'apply_fp8_renamed', 0)
    lines = harness.diff(view, other)
    assert len(lines) == 2, lines
    assert any('.lr[3][0][0]' in line for line in lines) and any('.hooks[5][1]' in line for line in lines), lines


def test_recordings_match_the_committed_snapshots(reference_docs):
    # tests/reference/snapshots/*.json: the reference's recordings as committed (for reading without
    # building the venv); a live run must give the same comparable view (the reference is deterministic).
    import json
    import os

    for scenario, doc in reference_docs.items():
        with open(os.path.join(harness.HERE, 'snapshots', scenario + '.json')) as f:
            snapshot = json.load(f)
        assert harness.diff(harness.comparable(snapshot), harness.comparable(doc)) == [], scenario
