"""train.count_flops for a diffusers transformer: the FLOPs counted once on fake tensors for the tiny Wan equal
an analytic count (every Linear's and the patch Conv3d's matmuls, forward and backward, and attention's two
S x S matmuls) within 1%; the trainer logs TFLOP/s from that count."""
import json

import pytest
import torch

pytest.importorskip("diffusers")

from examples.wan.scripts import build_dataset  # noqa: E402
from giga_train.cli import main as cli  # noqa: E402
from giga_train.tools.offline import offline_trainer  # noqa: E402
from giga_train.trainers.flop_count import count_flops_per_sample  # noqa: E402

TINY = "examples/wan/configs/tiny_cpu.py"
BATCH, LATENTS, TEXT = 4, (4, 3, 8, 8), (16, 32)


def analytic_flops_per_sample(arch):
    """2 FLOPs a multiply-add; a weight's matmul runs 3 times (forward, input gradient, weight gradient), twice
    where its input needs no gradient (the embedders of the latents, the timestep and the text)."""
    from diffusers import WanTransformer3DModel
    torch.manual_seed(0)
    model = WanTransformer3DModel(**arch)
    total = 0

    def hook(module, args, output):
        nonlocal total
        x = args[0]
        passes = 3 if x.requires_grad else 2
        if isinstance(module, torch.nn.Linear):
            total += 2 * x.numel() // module.in_features * module.in_features * module.out_features * passes
        else:  # the patch embedding: one output position = one matmul row over in_channels x kernel
            positions = output.numel() // module.out_channels
            total += 2 * positions * module.out_channels * module.weight[0].numel() * passes
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv3d)):
            m.register_forward_hook(hook)
    latents = torch.randn(BATCH, *LATENTS)
    model(hidden_states=latents, timestep=torch.full((BATCH,), 500.0),
          encoder_hidden_states=torch.randn(BATCH, *TEXT), return_dict=False)
    heads, dim = arch["num_attention_heads"], arch["attention_head_dim"]
    p = arch["patch_size"]
    tokens = LATENTS[1] // p[0] * (LATENTS[2] // p[1]) * (LATENTS[3] // p[2])
    # per block: self-attention (tokens x tokens) and cross-attention (tokens x text); QK^T and AV, each
    # 2 * B * H * Sq * Sk * D, forward and twice that backward
    attention = arch["num_layers"] * 3 * 2 * 2 * BATCH * heads * dim * tokens * (tokens + TEXT[0])
    return (total + attention) / BATCH


def test_counted_flops_of_the_tiny_wan_equal_the_analytic_count(tmp_path):
    data = tmp_path / "data"
    assert build_dataset.main(["--synthetic", "4", "--out", str(data), "--latent-shape", ",".join(map(str, LATENTS)),
                               "--text-shape", ",".join(map(str, TEXT))]) == 0
    trainer = offline_trainer(TINY, [f"project_dir={tmp_path}", f"dataloaders.train.data_or_config.root={data}"],
                              device="cpu")
    counted = count_flops_per_sample(trainer, BATCH)
    want = analytic_flops_per_sample(dict(trainer.config.models.transformer))
    assert counted == pytest.approx(want, rel=0.01)

    rc = cli(["train", TINY, "--set", f"project_dir={tmp_path}", "--set", f"dataloaders.train.data_or_config.root={data}",
              "--set", "train.max_steps=2", "--set", "train.log_interval=1", "--set", "train.log_with='jsonl'",
              "--set", "train.count_flops=True", "--set", "train.peak_flops=1e12", "--set", "train.resume=False",
              "--set", "train.progress_bar=False"])
    assert rc == 0
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()][1:]
    for row in rows:  # the count of the model, not of the checkpointed step (which recomputes the blocks)
        assert row["tflops_per_device"] * 1e12 == pytest.approx(row["samples_per_sec"] * counted, rel=1e-6)
        assert row["mfu"] == pytest.approx(row["tflops_per_device"], rel=1e-6)
