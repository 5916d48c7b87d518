"""`giga-train convert` on the DeepSpeed checkpoints it used to fail on: ZeRO-3 (its model-states file is
zero_pp_rank_N_mp_rank_00_model_states.pt) and ZeRO-0 in bf16 (DeepSpeed's wrapper around the torch
optimizer state, fp32 master weights beside it). Read through the allow-list like every other."""

import pytest
import torch

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints, read_weights
from giga_train.cli import main
from tests.distributed import job

pytest.importorskip("deepspeed")


@pytest.mark.parametrize("stage,ranks,precision", [(3, 2, "no"), (0, 1, "bf16")], ids=["zero3x2", "zero0x1_bf16"])
def test_convert_reads_every_deepspeed_layout(tmp_path, stage, ranks, precision):
    launch = dict(deepspeed_config=dict(deepspeed_config_file=f"zero{stage}.json"))
    launch_from_config(job(tmp_path / "run", "DEEPSPEED", ranks=ranks, launch=launch, max_steps=2,
                           mixed_precision=precision))
    path = list_checkpoints(str(tmp_path / "run" / "models"))[-1][1]
    assert main(["convert", path, "--to", "full", "--out", str(tmp_path / "full")]) == 0
    from safetensors.torch import load_file
    weights = load_file(tmp_path / "full" / "model.safetensors")
    saved = read_weights(path)  # model/: the engine's weights (bf16 under bf16, GigaTrain's), rounded from the masters
    assert weights.keys() == saved.keys() and all(torch.equal(weights[k].to(saved[k].dtype), saved[k]) for k in saved)
    assert {v.dtype for v in weights.values()} == {torch.float32}  # DeepSpeed's fp32 masters
    assert {v.dtype for v in saved.values()} == {torch.bfloat16 if precision == "bf16" else torch.float32}
    optimizer = torch.load(tmp_path / "full" / "optimizer.pt", weights_only=True)
    from examples.char_lm.model import CharLM
    from tests.tiny import MODEL
    names = {n for n, _ in CharLM(**MODEL).named_parameters()}
    assert set(optimizer["state"]) == names and optimizer["param_groups"][0]["lr"] > 0
    # DeepSpeed's unfused bf16/fp16 wrapper (ZeRO-0) takes one zero-gradient step at start-up
    # (initialize_optimizer_states): its Adam step count is one ahead of the trainer's
    expected = 2 + (stage == 0 and precision != "no")
    assert {float(s["step"]) for s in optimizer["state"].values()} == {expected}
    assert main(["convert", path, "--to", "dcp", "--out", str(tmp_path / "dcp")]) == 0
