"""The Wan example: flow-matching schedule, dataset builder, missing weights, and the tiny config trained,
checkpointed and resumed through the real Trainer on CPU."""
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("diffusers")

from examples.wan import flow_matching as fm  # noqa: E402
from examples.wan.data import WanLatentDataset  # noqa: E402
from examples.wan.model import WAN22_TI2V_5B, latent_shape  # noqa: E402
from examples.wan.scripts import build_dataset  # noqa: E402
from examples.wan.trainer import WanTrainer  # noqa: E402
from giga_train.cli import main as cli  # noqa: E402

TINY = "examples/wan/configs/tiny_cpu.py"


class RecordingWanTrainer(WanTrainer):
    """Keeps every micro-batch loss (a host sync per step: fine for a test)."""
    losses = []

    def forward_step(self, batch_dict):
        loss = super().forward_step(batch_dict)
        RecordingWanTrainer.losses.append(loss.item())
        return loss


# -- the schedule and the objective ------------------------------------------------------------------
def test_shift_keeps_the_ends_and_moves_the_middle_towards_noise():
    s = torch.tensor([0.0, 0.25, 0.5, 1.0])
    assert torch.allclose(fm.shift_sigmas(s, 5.0), torch.tensor([0.0, 1.25 / 2.0, 2.5 / 3.0, 1.0]))
    assert torch.equal(fm.shift_sigmas(s, 1.0), s)
    assert torch.allclose(fm.shift_sigmas(torch.tensor(0.5), 3.0), torch.tensor(0.75))


def test_sampled_sigmas_follow_the_shifted_schedule():
    torch.manual_seed(0)
    uniform = fm.sample_sigmas(20000, 5.0, "uniform")
    assert uniform.shape == (20000,) and 0 <= uniform.min() and uniform.max() <= 1
    # P(sigma' <= 5/6) = P(s <= 1/2) = 1/2 under the shift: the median lands at 5/6, not 1/2
    assert abs((uniform <= 5 / 6).float().mean().item() - 0.5) < 0.02
    discrete = fm.sample_sigmas(5000, 5.0, "discrete")
    grid = fm.shift_sigmas(torch.arange(1, 1001) / 1000, 5.0)
    assert torch.isin(discrete, grid).all() and discrete.unique().numel() > 900
    assert torch.allclose(fm.timesteps_from_sigmas(torch.tensor([0.5])), torch.tensor([500.0]))
    with pytest.raises(ValueError, match="uniform"):
        fm.sample_sigmas(2, 5.0, "logit")


def test_noising_interpolates_and_the_target_is_its_velocity():
    x0, noise = torch.randn(3, 4, 2, 4, 4), torch.randn(3, 4, 2, 4, 4)
    sigmas = torch.tensor([0.0, 0.3, 1.0])
    xt = fm.noisy_latents(x0, noise, sigmas)
    assert torch.equal(xt[0], x0[0]) and torch.equal(xt[2], noise[2])
    later = fm.noisy_latents(x0, noise, sigmas + 0.1)  # d x_t / d sigma is the velocity target
    assert torch.allclose((later - xt) / 0.1, fm.velocity_target(x0, noise), atol=1e-4)
    loss = fm.flow_matching_loss(torch.zeros(2, 3, dtype=torch.bfloat16), torch.full((2, 3), 2.0))
    assert loss.dtype == torch.float32 and loss.item() == 4.0


# -- data --------------------------------------------------------------------------------------------
def test_wan22_shapes():
    assert latent_shape(49, 480, 832) == (48, 13, 30, 52)  # 13 * 15 * 26 = 5070 tokens after 1x2x2 patches
    with pytest.raises(ValueError, match="4k\\+1"):
        latent_shape(48, 480, 832)


def test_synthetic_builder_writes_readable_samples(tmp_path, capsys):
    out = tmp_path / "data"
    assert build_dataset.main(["--synthetic", "3", "--out", str(out), "--latent-shape", "4,3,8,8",
                               "--text-shape", "10,32"]) == 0
    assert "wrote 3 synthetic samples" in capsys.readouterr().out
    dataset = WanLatentDataset(str(out), text_len=16)
    assert len(dataset) == 3
    sample = dataset[2]
    assert sample["latents"].shape == (4, 3, 8, 8) and sample["latents"].dtype == torch.float32
    assert sample["text_embeds"].shape == (16, 32)
    assert sample["text_embeds"][10:].abs().sum() == 0 and sample["text_embeds"][:10].abs().min() > 0
    assert not torch.equal(dataset[0]["latents"], dataset[1]["latents"])
    assert build_dataset.main(["--synthetic", "1", "--out", str(tmp_path / "bad"), "--frames", "48"]) == 2
    assert not (tmp_path / "bad").exists()


def test_missing_weights_folder_is_one_line_exit_2_and_nothing_written(tmp_path):
    videos, out = tmp_path / "videos", tmp_path / "out"
    videos.mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")  # any download would fail loudly
    run = subprocess.run([sys.executable, "examples/wan/scripts/build_dataset.py", "--videos", str(videos),
                          "--vae", str(tmp_path / "no_such_wan"), "--text-encoder", str(tmp_path / "no_such_wan"),
                          "--out", str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert "--vae: no local diffusers folder at" in run.stderr and "never downloaded" in run.stderr
    assert not out.exists()


def test_missing_pretrained_transformer_is_one_line_exit_2(tmp_path, capsys):
    data = tmp_path / "data"  # the data is built first (GigaTrain's order: get_dataloaders, then get_models)
    assert build_dataset.main(["--synthetic", "2", "--out", str(data), "--latent-shape", "4,1,8,8",
                               "--text-shape", "16,32"]) == 0
    rc = cli(["train", TINY, "--set", f"project_dir={tmp_path}", "--set", f"models.pretrained={tmp_path}/none",
              "--set", f"dataloaders.train.data_or_config.root={data}"])
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the dataset builder's progress bar
    assert rc == 2 and err.startswith("giga-train: error: models.pretrained") and f"{tmp_path}/none" in err
    assert not (tmp_path / "models").exists()


def save_tiny_wan_encoders(root):
    """A random Wan2.2-style VAE (patch 2, 16x spatial, 4x temporal, 4 latent channels), a 1-layer UMT5
    and a word-level tokenizer, saved as a local diffusers folder."""
    from diffusers import AutoencoderKLWan
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel
    torch.manual_seed(0)
    AutoencoderKLWan(base_dim=8, z_dim=4, num_res_blocks=1, is_residual=True, in_channels=12, out_channels=12,
                     patch_size=2, scale_factor_spatial=16, latents_mean=[0.5, 0.0, 0.0, 0.0],
                     latents_std=[2.0, 1.0, 1.0, 1.0]).save_pretrained(os.path.join(root, "vae"))
    words = ["<pad>", "</s>", "<unk>", "a", "cat", "dog", "runs"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(os.path.join(root, "tokenizer"))
    UMT5EncoderModel(UMT5Config(vocab_size=len(words), d_model=32, num_layers=1, num_heads=2, d_kv=16,
                                d_ff=64)).save_pretrained(os.path.join(root, "text_encoder"))


def test_encoding_images_and_frame_folders_with_local_encoders(tmp_path, capsys):
    pytest.importorskip("transformers")
    from PIL import Image
    from safetensors.torch import load_file
    save_tiny_wan_encoders(tmp_path / "wan")
    videos = tmp_path / "videos"
    (videos / "clip_b").mkdir(parents=True)
    Image.fromarray((torch.rand(40, 50, 3) * 255).byte().numpy()).save(videos / "a.png")
    (videos / "a.txt").write_text("a cat")
    for i in range(7):  # 7 frames: the first 4k+1 = 5 are kept
        Image.fromarray((torch.rand(48, 64, 3) * 255).byte().numpy()).save(videos / "clip_b" / f"{i:03d}.png")
    (videos / "clip_b.txt").write_text("a  dog\nruns")
    out = tmp_path / "out"
    args = ["--videos", str(videos), "--vae", str(tmp_path / "wan"), "--text-encoder", str(tmp_path / "wan"),
            "--out", str(out), "--frames", "9", "--height", "32", "--width", "32", "--device", "cpu"]
    assert build_dataset.main(args) == 0
    image, clip = (load_file(str(out / f"sample_00000{i}.safetensors")) for i in (0, 1))
    assert image["latents"].shape == (4, 1, 2, 2) and clip["latents"].shape == (4, 2, 2, 2)
    assert image["text_embeds"].shape == (2, 32) and clip["text_embeds"].shape == (3, 32)  # real tokens only
    # the latents are the VAE's mode, normalised by the VAE config's mean and std
    from diffusers import AutoencoderKLWan
    from examples.wan.encode import prepare_clip, read_frames
    vae = AutoencoderKLWan.from_pretrained(str(tmp_path / "wan/vae"))
    with torch.no_grad():
        z = vae.encode(prepare_clip(read_frames(str(videos / "clip_b")), 9, 32, 32)[None]).latent_dist.mode()[0]
    expected = (z - torch.tensor([0.5, 0, 0, 0]).view(-1, 1, 1, 1)) / torch.tensor([2.0, 1, 1, 1]).view(-1, 1, 1, 1)
    assert torch.allclose(clip["latents"].float(), expected, atol=3e-2, rtol=1e-2)
    (videos / "c.png").write_bytes((videos / "a.png").read_bytes())  # no c.txt: refused before any encoding
    assert build_dataset.main(args[:-10] + ["--out", str(tmp_path / "out2")]) == 2
    assert "without a caption" in capsys.readouterr().err and not (tmp_path / "out2").exists()


# -- the tiny config through the real Trainer -----------------------------------------------------------
def train(project, data, steps):
    RecordingWanTrainer.losses = []
    rc = cli(["train", TINY, "--set", f"project_dir={project}", "--set", f"dataloaders.train.data_or_config.root={data}",
              "--set", "runners=['tests.test_wan.RecordingWanTrainer']", "--set", f"train.max_steps={steps}",
              "--set", "train.checkpoint_interval=4", "--set", "train.log_with='none'",
              "--set", "train.progress_bar=False"])
    assert rc == 0
    return list(RecordingWanTrainer.losses)


def test_tiny_config_trains_checkpoints_and_resumes_exactly(tmp_path):
    from diffusers import WanTransformer3DModel
    from safetensors.torch import load_file
    data = tmp_path / "data"
    assert build_dataset.main(["--synthetic", "16", "--out", str(data), "--latent-shape", "4,3,8,8",
                               "--text-shape", "16,32"]) == 0
    full = train(tmp_path / "full", data, 12)
    assert len(full) == 24 and all(torch.isfinite(torch.tensor(full)))  # 2 micro-batches per step
    assert sum(full[-6:]) / 6 < sum(full[:6]) / 6  # the loss goes down
    folder = tmp_path / "full/models/checkpoint_epoch_6_step_12/model"  # 4 batches an epoch
    weights = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
    from giga_train import load_config
    model = WanTransformer3DModel(**dict(load_config(TINY).models.transformer))
    model.load_state_dict(weights)  # strict: the checkpoint is the whole transformer
    # GigaTrain's layout: a diffusers folder (from_pretrained itself needs accelerate for this model's fp32
    # modules, not installed here: its config.json builds the model, as from_pretrained does)
    rebuilt = WanTransformer3DModel.from_config(WanTransformer3DModel.load_config(str(folder)))
    rebuilt.load_state_dict(weights)

    first = train(tmp_path / "split", data, 8)
    second = train(tmp_path / "split", data, 12)
    assert first == full[:16]
    assert second == full[16:]  # resumed from step 8: same data, same noise, same weights


def test_scripts_train_runs_a_config(tmp_path):
    data = tmp_path / "data"
    assert build_dataset.main(["--synthetic", "4", "--out", str(data), "--latent-shape", "4,1,8,8",
                               "--text-shape", "16,32"]) == 0
    run = subprocess.run([sys.executable, "examples/wan/scripts/train.py", TINY, "--set", f"project_dir={tmp_path}/p",
                          "--set", f"dataloaders.train.data_or_config.root={data}", "--set", "train.max_steps=2",
                          "--set", "train.progress_bar=False"], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "done at step 2" in run.stderr and (tmp_path / "p/logs").is_dir()


# -- the 5B configs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["examples/wan/configs/wan_5b_t2v_ft.py", "examples/wan/configs/wan_5b_t2v_ft_fsdp2.py"])
def test_5b_configs_validate(path, capsys):
    assert cli(["check", path, "--set", "launch.gpu_ids=None"]) == 0, capsys.readouterr().err
    from giga_train import load_config
    cfg = load_config(path)
    assert cfg.launch.gpu_ids == list(range(8))
    assert cfg.train.activation_checkpointing and cfg.train.activation_class_names == ["WanTransformerBlock"]
    assert (cfg.train.mixed_precision, cfg.train.log_interval, cfg.train.checkpoint_interval,
            cfg.train.checkpoint_total_limit) == ("bf16", 1, 500, 3)
    if "fsdp2" in path:
        assert cfg.launch.fsdp_config.fsdp_transformer_layer_cls_to_wrap == "WanTransformerBlock"
    else:
        assert cfg.launch.deepspeed_config.deepspeed_config_file.endswith("zero2.json")


def test_5b_architecture_has_five_billion_parameters():
    from diffusers import WanTransformer3DModel
    with torch.device("meta"):
        model = WanTransformer3DModel(**WAN22_TI2V_5B)
    assert sum(p.numel() for p in model.parameters()) == 4_999_787_712
    assert len(model.blocks) == 30 and model.blocks[0].attn1.heads == 24


# -- samples at validation ------------------------------------------------------------------------------
@pytest.mark.parametrize("with_vae", [False, True])
def test_validation_logs_a_generated_clip(tmp_path, with_vae):
    """sample_step: 2 Euler steps of the tiny transformer, decoded by a tiny local VAE (9 frames of 128x128
    from 3x8x8 latents) or shown as the latents' first channels (3 frames of 8x8), as a GIF in the JSONL run."""
    import json
    from PIL import Image
    data = tmp_path / "data"
    assert build_dataset.main(["--synthetic", "4", "--out", str(data), "--latent-shape", "4,3,8,8",
                               "--text-shape", "16,32"]) == 0
    more = []
    if with_vae:
        save_tiny_wan_encoders(tmp_path / "wan")
        more = ["--set", f"models.vae='{tmp_path / 'wan'}'"]
    val = {"data_or_config": {"_class_name": "WanLatentDataset", "root": str(data), "text_len": 16}, "batch_size_per_gpu": 2}
    rc = cli(["train", TINY, "--set", f"project_dir={tmp_path}/p", "--set", f"dataloaders.train.data_or_config.root={data}",
              "--set", f"dataloaders.val={val}", "--set", "train.eval_interval=2", "--set", "train.max_steps=2",
              "--set", "models.sample_steps=2", "--set", "train.log_with='jsonl'", "--set", "train.progress_bar=False",
              "--set", "train.activation_checkpointing=False", *more])
    assert rc == 0
    lines = [json.loads(line) for line in (tmp_path / "p/logs/metrics.jsonl").read_text().splitlines()]
    [clip] = [line["samples/clip"] for line in lines if "samples/clip" in line]
    frames, height, width = (9, 128, 128) if with_vae else (3, 8, 8)
    assert clip["type"] == "video" and clip["shape"] == [frames, height, width, 3]
    gif = Image.open(tmp_path / "p/logs" / clip["path"])
    assert gif.size == (width, height) and gif.n_frames <= frames
