"""bench/wan.py's other side: the same Wan fine-tune written as a GigaTrain 1.1.0 project writes it (a Trainer
subclass: get_dataloaders over the sample files, get_models, forward_step) and run by the real GigaTrain.

    python bench/wan_gigatrain.py --row SPEC --row-result FILE      (bench/wan.py runs it)

It runs where `giga_train` is GigaTrain's (its folder first on PYTHONPATH, or its venv) and never imports our
package: the repository root goes at the end of sys.path, after site-packages, only for examples/wan's
objective and sample format, so both sides compute the same loss from the same files.

A one-GPU job under DEEPSPEED or FSDP goes through GigaTrain's Launcher (`accelerate launch`, one process):
GigaTrain's launch_from_config would run it in-process with a plain Accelerator, without DeepSpeed or FSDP."""
import argparse
import json
import os
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.append(ROOT)

import torch  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler  # noqa: E402

import giga_train  # noqa: E402

if os.path.dirname(os.path.abspath(giga_train.__file__)) == os.path.join(ROOT, "giga_train") \
        or giga_train.__version__ != "1.1.0":
    raise SystemExit(f"bench/wan_gigatrain.py: needs the real GigaTrain 1.1.0, got giga_train"
                     f" {giga_train.__version__} from {giga_train.__file__}")
from giga_train import Launcher, Trainer  # noqa: E402

from examples.wan.flow_matching import (flow_matching_loss, noisy_latents, sample_sigmas,  # noqa: E402
                                        timesteps_from_sigmas, velocity_target)
from examples.wan.samples import read_sample  # noqa: E402
from step_clock import TimedSteps  # noqa: E402

RESULT = "WAN_BENCH_RESULT"  # where the training process writes its row (it may be accelerate's child)


class SampleFolder(Dataset):
    def __init__(self, root, text_len):
        self.files = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".safetensors"))
        self.text_len = text_len

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        return read_sample(self.files[index], self.text_len)


class GigaTrainWan(Trainer):
    """The Wan fine-tune as a GigaTrain 1.1.0 project writes it."""

    def get_dataloaders(self, data_config):
        dataset = SampleFolder(data_config.root, data_config.text_len)
        # GigaTrain's loop draws max_steps batches from one iterator: the sampler must not run out
        sampler = RandomSampler(dataset, replacement=True, num_samples=10**9,
                                generator=torch.Generator().manual_seed(self.seed))
        batch_sampler = BatchSampler(sampler, batch_size=data_config.batch_size_per_gpu, drop_last=False)
        if self.accelerator.state.deepspeed_plugin is not None:  # what GigaTrain's own get_dataloaders sets
            self.accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = \
                data_config.batch_size_per_gpu
        return DataLoader(dataset, batch_sampler=batch_sampler, num_workers=data_config.num_workers)

    def get_models(self, model_config):
        from diffusers import WanTransformer3DModel
        arch = dict(model_config.transformer)
        arch["patch_size"] = tuple(arch["patch_size"])
        self.flow_shift = model_config.flow_shift
        with torch.device(self.device):  # as our WanTrainer: random init on the training device
            return WanTransformer3DModel(**arch)

    def forward_step(self, batch_dict):
        x0 = batch_dict["latents"].float()
        noise = torch.randn_like(x0)
        sigmas = sample_sigmas(x0.shape[0], self.flow_shift, device=x0.device)
        dtype = next(self.model.parameters()).dtype  # bf16 under DeepSpeed, fp32 (autocast) otherwise
        prediction = self.model(hidden_states=noisy_latents(x0, noise, sigmas).to(dtype),
                                timestep=timesteps_from_sigmas(sigmas),
                                encoder_hidden_states=batch_dict["text_embeds"].to(dtype), return_dict=False)[0]
        return flow_matching_loss(prediction, velocity_target(x0, noise))


class GigaTrainWanTrainer(TimedSteps, GigaTrainWan):
    """The project, timed as bench/wan.py times ours (bench/step_clock.py); it writes the row at the end."""

    def backward_owner(self):
        return self.accelerator

    def train(self):
        super().train()
        if self.is_main_process:
            with open(os.environ[RESULT], "w") as f:
                json.dump(self.result(), f)


def run_row(spec, config, result_path):
    """Train through GigaTrain; the row comes from the training process (accelerate's child or this one)."""
    from giga_train import load_config
    from giga_train.distributed.run_task import run_tasks
    os.environ[RESULT] = result_path
    os.environ["PYTHONPATH"] = os.pathsep.join([BENCH, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    sys.path.insert(0, BENCH)
    config_path = os.path.join(config["project_dir"], "bench_config.json")
    os.makedirs(config["project_dir"], exist_ok=True)
    load_config(config).save(config_path)
    if config["launch"].get("distributed_type", "NO") == "NO":
        if spec["device"] == "cuda":
            torch.cuda.set_device(0)
        run_tasks(config_path)
    else:
        run_task = os.path.join(os.path.dirname(giga_train.__file__), "distributed", "run_task.py")
        Launcher(**config["launch"]).launch(f"{run_task} --config {config_path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--row", required=True, help="the row's spec and GigaTrain config, JSON")
    p.add_argument("--row-result", required=True)
    args = p.parse_args()
    job = json.loads(args.row)
    run_row(job["spec"], job["config"], args.row_result)


if __name__ == "__main__":
    main()
