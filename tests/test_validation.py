"""Validation during training (train.eval_interval, validation_step), metrics that are not trained
(log_metric), the best checkpoint by a validation metric, and the progress bar."""
import json
import os
import re

import pytest
import torch

from examples.char_lm.data import StdlibText
from examples.char_lm.model import CharLM
from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints, read_weights
from giga_train.config import Config
from giga_train.errors import ConfigError
from giga_train.schema import validate_config
from giga_train.tracking.logger import bar_postfix
from giga_train.trainers.validation import EvenRankShard
from tests.distributed import final_weights
from tests.tiny import MODEL, tiny_config
from tests.tiny_eval import VAL_SAMPLES, eval_job

FSDP2 = dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block"))
CACHE = {}


def validations(project, ranks):
    """Each rank's [[step, results], ...] (ValTrainer writes them)."""
    return [json.load(open(os.path.join(project, f"val_rank_{r}.json"))) for r in range(ranks)]


def val_mean(weights):
    """The mean loss of `weights` over every validation sample, one at a time (no sharding, no batching)."""
    model = CharLM(**dict(MODEL, dropout=0.1)).eval()
    model.load_state_dict(weights)
    data = StdlibText(block_size=16, stride=16, max_bytes=40_000, split="val", val_fraction=0.004)
    assert len(data) == VAL_SAMPLES
    with torch.no_grad():
        losses = [model(data[i]["tokens"][None], data[i]["targets"][None]).item() for i in range(len(data))]
    return sum(losses) / len(losses)


def one_process(tmp_path_factory, **train):
    key = repr(sorted(train.items()))
    if key not in CACHE:
        project = tmp_path_factory.mktemp("no")
        trainer = launch_from_config(eval_job(project, **train))
        CACHE[key] = project, trainer.last_metrics
    return CACHE[key]


def test_even_rank_shard_covers_every_sample_once_with_equal_batch_counts():
    for size, batch, world in [(9, 2, 2), (9, 4, 4), (3, 4, 2), (8, 2, 2), (10, 3, 3)]:
        shards = [EvenRankShard(size, batch, rank, world) for rank in range(world)]
        assert len({len(list(s)) for s in shards}) == 1 and all(len(list(s)) == len(s) for s in shards)
        counted = [i for s in shards for b, w in zip(s, s.weights()) if w for i in b]
        assert sorted(counted) == list(range(size)), (size, batch, world)
        assert all(w in (0, len(b)) for s in shards for b, w in zip(s, s.weights()))


def test_validation_is_the_sample_mean_of_the_trained_weights(tmp_path_factory):
    """One process: val/loss at the last step is the mean loss over every validation sample, computed here
    from the final checkpoint's weights; it is logged with the step's scalars."""
    project, metrics = one_process(tmp_path_factory)
    [runs] = validations(project, 1)
    assert [step for step, _ in runs] == [2, 4]
    assert runs[-1][1]["val/loss"] == pytest.approx(val_mean(final_weights(project)), rel=1e-5)
    assert metrics["val/loss"] == runs[-1][1]["val/loss"]
    assert runs[0][1]["val/loss"] != runs[1][1]["val/loss"]  # the weights moved between the two


@pytest.mark.parametrize("strategy", ["DDP", "FSDP2"])
def test_validation_and_metrics_at_two_ranks(tmp_path, tmp_path_factory, strategy):
    """2 ranks (rank 0: 3 batches of val data, rank 1: 2 and a repeat): every rank gets the one-process
    results (FSDP2: validating on its sharded EMA weights); log_metric's values are averaged over the calls
    and the ranks."""
    train = dict(with_ema=True, ema_decay=0.5, eval_ema=True) if strategy == "FSDP2" else {}
    project, single = one_process(tmp_path_factory, **train)
    launch = FSDP2 if strategy == "FSDP2" else None
    result = launch_from_config(eval_job(tmp_path, "FSDP" if launch else "DDP", ranks=2, launch=launch, **train))
    expected = validations(project, 1)[0]
    for runs in validations(tmp_path, 2):
        assert [s for s, _ in runs] == [s for s, _ in expected]
        for (_, got), (_, want) in zip(runs, expected):
            assert got["val/loss"] == pytest.approx(want["val/loss"], rel=1e-5)
    metrics = result["metrics"]
    assert metrics["val/loss"] == pytest.approx(expected[-1][1]["val/loss"], rel=1e-5)
    # steps 3 and 4, 1 micro-batch each: one process logs rank 0's (0 + 3, 0 + 4), two ranks also rank 1's
    assert single["rank_value"] == 3.5 and metrics["rank_value"] == 4.0
    # only rank 0 logs only_main (the mean of [5, 7]); uneven: rank 0 once 1.0, rank 1 twice 10.0 per step
    assert single["only_main"] == metrics["only_main"] == 6.0
    assert single["uneven"] == 1.0 and metrics["uneven"] == pytest.approx((1 + 10 + 10) / 3)


def test_validation_on_ema_weights_leaves_the_training_unchanged(tmp_path):
    """With dropout: a run validating every step on the EMA weights ends on the same weights (bit for bit)
    as a run that never validates, and its last val/loss is that of the saved EMA weights."""
    def run(project, **train):
        cfg = eval_job(project, with_ema=True, ema_decay=0.5, **train)
        cfg["models"]["dropout"] = 0.1
        return launch_from_config(cfg)
    trainer = run(tmp_path / "eval", eval_interval=1, eval_ema=True)
    run(tmp_path / "plain", eval_interval=None)
    got, plain = final_weights(tmp_path / "eval"), final_weights(tmp_path / "plain")
    assert all(torch.equal(got[k], plain[k]) for k in plain)
    ema = read_weights(list_checkpoints(str(tmp_path / "eval" / "models"))[-1][1], ema=True)
    assert trainer.last_metrics["val/loss"] == pytest.approx(val_mean(ema), rel=1e-5)
    assert not torch.equal(ema["head.weight"], got["head.weight"])  # the average is not the trained weights


def test_best_checkpoint_is_kept_out_of_rotation_and_survives_resume(tmp_path, monkeypatch):
    """Validation every 2 steps, checkpoints every 3, total_limit 1: the best step's checkpoint is written
    although the interval skips it, kept past the limit, named in best.json, and replaced only by a better
    one (also after a resume, which restores the best value)."""
    models = tmp_path / "models"
    cfg = eval_job(tmp_path, runner="tests.tiny_eval.ScriptedScoreTrainer", max_steps=8, checkpoint_interval=3,
                   checkpoint_total_limit=1, checkpoint_best=dict(metric="val/score", mode="min"), resume=True)
    monkeypatch.setenv("GT_SCORES", "2:3,4:1,6:2,8:5,10:1.5,12:0.5")
    launch_from_config(cfg)
    assert [s for s, _ in list_checkpoints(str(models))] == [4, 8]
    best = json.load(open(models / "best.json"))
    assert (best["step"], best["value"], best["checkpoint"]) == (4, 1.0, "checkpoint_epoch_1_step_4")
    cfg["train"]["max_steps"] = 12
    launch_from_config(cfg)  # resumes at 8: 10's 1.5 is worse than 4's 1.0; 12's 0.5 is the new best
    assert [s for s, _ in list_checkpoints(str(models))] == [9, 12]
    assert json.load(open(models / "best.json"))["step"] == 12


def test_progress_bar_shows_named_losses_and_never_nan(tmp_path):
    cfg = tiny_config(tmp_path, runner="tests.tiny.DictLossTrainer", max_steps=4, log_interval=2, progress_bar=True)
    trainer = launch_from_config(cfg)
    shown = float(re.search(r"loss=([-0-9.]+)", trainer.run_log.metrics.bar.postfix).group(1))
    assert shown == pytest.approx(trainer.last_metrics["total_loss"], abs=1e-4)
    assert bar_postfix({"lr": 0.1}) == {}  # a window whose every step was skipped: no loss, not 'nan'
    assert bar_postfix({"total_loss": 2.0, "val/loss": 1.5}) == {"loss": "2.0000", "val_loss": "1.5000"}


def bad(tmp_path, **train):
    cfg = eval_job(tmp_path, **train)
    return lambda: validate_config(Config(cfg))


@pytest.mark.parametrize("train, message", [
    (dict(eval_intervall=2), "train.eval_intervall: unknown key; did you mean 'eval_interval'?"),
    (dict(eval_interval=0), "train.eval_interval: must be >= 1"),
    (dict(eval_ema=True), "train.eval_ema: needs train.with_ema=True"),
    (dict(checkpoint_best=dict(metric="loss")), "train.checkpoint_best: metric: name a validation result"),
    (dict(checkpoint_best=dict(metric="val/loss", mode="lowest")), "train.checkpoint_best: mode: 'min' or 'max'"),
    (dict(checkpoint_best=dict(metric="val/loss", metirc=1)), "unknown key 'metirc'; did you mean 'metric'?"),
    (dict(checkpoint_best=dict(metric="val/loss"), eval_interval=None),
     "train.checkpoint_best: set train.eval_interval"),
])
def test_bad_validation_keys_are_one_line(tmp_path, train, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        bad(tmp_path, **train)()


def test_eval_interval_needs_val_data_and_a_missing_best_metric_is_named(tmp_path):
    cfg = eval_job(tmp_path / "a")
    del cfg["dataloaders"]["val"]
    validate_config(Config(cfg))  # a GigaTrain fork's own kwarg: no val loader, nothing validated, no error
    with pytest.raises(ConfigError, match="train.checkpoint_best: set dataloaders.val too"):
        validate_config(Config(dict(cfg, train=dict(cfg["train"], checkpoint_best=dict(metric="val/loss")))))
    cfg["dataloaders"]["val"] = dict(batch_size_per_gpu=2)
    with pytest.raises(ConfigError, match="train.eval_interval: set dataloaders.val.data_or_config too"):
        validate_config(Config(cfg))
    cfg = eval_job(tmp_path / "b", checkpoint_best=dict(metric="val/acc"))
    with pytest.raises(ConfigError, match=re.escape("'val/acc' is not among the validation results (val/loss)")):
        launch_from_config(cfg)


def test_every_validation_draws_the_same_noise(tmp_path):
    """A validation_step drawing random numbers (a diffusion loss's noise and timesteps) draws the same ones
    at every validation, so its results compare across steps (checkpoint_best, early_stopping)."""
    launch_from_config(eval_job(tmp_path, runner="tests.tiny_eval.NoisyValTrainer", eval_interval=1, max_steps=3))
    [noise] = {results["val/noise"] for _, results in validations(tmp_path, 1)[0]}
    assert 0 < noise < 1
