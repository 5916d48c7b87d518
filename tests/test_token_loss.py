"""train.loss_normalization='tokens': with uneven lengths, accumulation and 2 ranks train on one big batch's
token mean: the same losses and weights as one process with the whole batch at once, under NO, DDP and FSDP2."""
import json
import re

import pytest

from giga_train import launch_from_config
from tests.distributed import BATCH, assert_same_weights, final_weights, job

FSDP2 = dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block"))
CACHE = {}


def run(project, distributed_type="NO", ranks=1, accumulation=1, normalization="tokens", launch=None):
    cfg = job(project, distributed_type, ranks, launch=launch, max_steps=2, log_interval=1,
              gradient_accumulation_steps=accumulation, loss_normalization=normalization, log_with="jsonl")
    cfg["runners"] = ["tests.tiny_tokens.TokenSumTrainer"]
    cfg["dataloaders"]["train"]["batch_size_per_gpu"] = BATCH // (ranks * accumulation)
    launch_from_config(cfg)
    rows = [json.loads(line) for line in next(project.rglob("metrics.jsonl")).read_text().splitlines()]
    losses = [row["total_loss"] for row in rows if "total_loss" in row]
    return losses, final_weights(project)


def one_big_batch(tmp_path_factory):
    if "ref" not in CACHE:  # one process, the 8 samples of a step in one batch: the token mean is plain
        CACHE["ref"] = run(tmp_path_factory.mktemp("big"))
    return CACHE["ref"]


@pytest.mark.parametrize("kind, ranks, launch", [("NO", 1, None), ("DDP", 2, None), ("FSDP", 2, FSDP2)],
                         ids=["NO", "DDP", "FSDP2"])
def test_token_mean_over_accumulation_and_ranks_is_one_big_batch(tmp_path, tmp_path_factory, kind, ranks, launch):
    losses, weights = run(tmp_path, kind, ranks, accumulation=2, launch=launch)
    expected_losses, expected_weights = one_big_batch(tmp_path_factory)
    assert len(losses) == 2 and losses == pytest.approx(expected_losses, rel=1e-6)
    assert_same_weights(weights, expected_weights, rtol=1e-5, atol=1e-6)


def test_the_mean_of_micro_batch_means_is_not(tmp_path, tmp_path_factory):
    """What the option fixes: the default averages the micro-batches' own token means."""
    losses, weights = run(tmp_path, accumulation=2, normalization="mean")
    expected_losses, expected_weights = one_big_batch(tmp_path_factory)
    assert losses[0] != pytest.approx(expected_losses[0], rel=1e-5)  # off by 10x the tolerance above
    with pytest.raises(AssertionError):
        assert_same_weights(weights, expected_weights, rtol=1e-5, atol=1e-6)


def test_forward_step_of_another_form_is_one_line():
    from giga_train.errors import ConfigError
    from giga_train.trainers.token_normalization import TokenCount
    import torch
    with pytest.raises(ConfigError, match=re.escape("forward_step must return dict(loss_sum=<summed per-token")):
        TokenCount().take(torch.tensor(1.0))


def test_validation_under_tokens_is_every_validation_tokens_mean(tmp_path):
    """forward_step's dict(loss_sum, num_tokens) as the default validation_step: val/loss is the summed loss of
    every validation token over their count (9 samples, batches of 2, uneven lengths), not a mean of sums."""
    from types import SimpleNamespace

    import torch
    from examples.char_lm.data import StdlibText
    from examples.char_lm.model import CharLM
    from tests.tiny import MODEL
    from tests.tiny_eval import eval_job
    from tests.tiny_tokens import TokenSumTrainer
    cfg = eval_job(tmp_path, runner="tests.tiny_tokens.TokenSumTrainer", loss_normalization="tokens",
                   log_with="jsonl", max_steps=2)
    trainer = launch_from_config(cfg)
    model = CharLM(**dict(MODEL, dropout=0.0)).eval()
    model.load_state_dict(final_weights(tmp_path))
    val = dict(cfg["dataloaders"]["val"]["data_or_config"])
    del val["_class_name"]
    data, one = StdlibText(**val), SimpleNamespace(model=model, train_config=trainer.train_config)
    with torch.no_grad():  # one sample at a time: no batching, no sharding
        outs = [TokenSumTrainer.forward_step(one, {k: v[None] for k, v in data[i].items()}) for i in range(len(data))]
    expected = sum(o["loss_sum"].item() for o in outs) / sum(o["num_tokens"].item() for o in outs)
    assert trainer.last_metrics["val/loss"] == pytest.approx(expected, rel=1e-5)
    assert not [name for name in trainer.last_metrics if name.startswith("val/") and name != "val/loss"]
