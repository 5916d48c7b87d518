"""Meta-device start (issue 20 item 1): peak host RSS per rank and start time of an FSDP2 or DeepSpeed ZeRO-3
job, today's path (every rank builds the whole model on the CPU, then shards it) against rank-0 loading
(fsdp_cpu_ram_efficient_loading / zero3_init_flag: ranks > 0 build on meta, rank 0's weights are broadcast)
and a meta start (every rank builds on meta; each fills its shard or partition, from a safetensors file read
piece by piece, or by initialising on the device).

Peak RSS is /proc/self/status VmHWM of each rank, read once the model is materialised (get_optimizers, before
the engine: DeepSpeed's ZeRO-3 engine allocates its own buffers after that), right after sharding (the start)
and after one step; "start" is the time from the Trainer's construction to the end of sharding. Writes a
table and JSON.

    python3 bench/meta_start.py --shape cpu200 --ranks 2 --device cpu              # the CPU table
    python3 bench/meta_start.py --shape cpu200 --ranks 2 --device cpu --strategy zero3 --out bench/meta_start_zero3.json
    python3 bench/meta_start.py --shape 8b --ranks 1 --device cuda --modes today,meta_init  # one H200
"""
import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.llama import SHAPES, Llama, SyntheticTokens, rope_tables  # noqa: E402
from giga_train import Trainer, launch_from_config, load_safetensors_shards  # noqa: E402
from giga_train.engine.meta_start import gathered  # noqa: E402

# ~52M parameters (210 MB fp32): big enough that a whole copy per rank shows beside torch's own ~0.4 GB
BENCH_SHAPES = dict(SHAPES, cpu200=replace(SHAPES["tiny"], dim=768, layers=4, heads=12, kv_heads=12, ffn=2048,
                                            vocab=16000, seq=32, batch=1),
                    # ~187M parameters (0.70 GB fp32), 12 layers: the model well above DeepSpeed's fixed host cost,
                    # its largest module (the 16000-row embedding, 9% of it) well below the model
                    cpu700=replace(SHAPES["tiny"], dim=1024, layers=12, heads=16, kv_heads=16, ffn=2816, vocab=16000,
                                   seq=32, batch=1))


def status_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class MetaBenchTrainer(Trainer):
    def __init__(self, project_dir, **train):
        self.constructed = time.perf_counter()
        super().__init__(project_dir, **train)

    def get_models(self, model_config):
        self.mode, self.shape = model_config["mode"], replace(SHAPES["tiny"], **model_config["shape"])
        self.pretrained = model_config.get("pretrained")
        self.rss_before_model_kb = status_kb("VmRSS")
        if self.mode.startswith("meta"):
            with torch.device("meta"):
                return Llama(self.shape)
        torch.manual_seed(0)
        return Llama(self.shape)  # rank0 mode: built on meta on ranks > 0 by the trainer (the key)

    def init_weights(self, model):
        if self.mode == "meta_safetensors":
            load_safetensors_shards(model, self.pretrained)
        else:  # meta_init: initialised where the shard lives (the GPU), as Llama.__init__ does on the CPU
            for module in model.modules():
                with gathered(module.parameters(recurse=False)):  # ZeRO-3: one module's parameters whole
                    if isinstance(module, (nn.Linear, nn.Embedding)):
                        nn.init.normal_(module.weight, std=0.02)
                    elif hasattr(module, "eps"):
                        nn.init.ones_(module.weight)
        cos, sin = rope_tables(self.shape.seq, self.shape.head_dim)  # non-persistent buffers
        model.cos.copy_(cos)
        model.sin.copy_(sin)

    def get_optimizers(self, optimizers):  # the model is materialised; the engine is not built yet
        self.hwm_model_kb = status_kb("VmHWM")
        return super().get_optimizers(optimizers)

    def set_ema_models(self):  # right after sharding
        self.started_s = time.perf_counter() - self.constructed
        self.hwm_start_kb, self.rss_start_kb = status_kb("VmHWM"), status_kb("VmRSS")
        super().set_ema_models()

    def forward_step(self, batch_dict):
        return self.model(batch_dict["tokens"])

    def save_checkpoint(self):
        pass  # the bench measures the start, not the writing of the weights

    def print_after_train(self):
        super().print_after_train()
        result = dict(rank=self.rank, mode=self.mode, start_s=round(self.started_s, 2),
                      rss_before_model_gb=round(self.rss_before_model_kb / 2**20, 3),
                      hwm_model_gb=round(self.hwm_model_kb / 2**20, 3),
                      hwm_start_gb=round(self.hwm_start_kb / 2**20, 3),
                      rss_after_sharding_gb=round(self.rss_start_kb / 2**20, 3),
                      hwm_after_step_gb=round(status_kb("VmHWM") / 2**20, 3),
                      gpu_peak_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2) if self.device.type == "cuda"
                      else None)
        with open(os.path.join(self.project_dir, f"rank_{self.rank}.json"), "w") as f:
            json.dump(result, f)


def launch_config(strategy, mode, ranks, device):
    gpus = dict(gpu_ids=list(range(ranks))) if device == "cuda" else {}  # without gpu_ids a job runs on the CPU
    if strategy == "zero3":
        return dict(distributed_type="DEEPSPEED", num_processes=ranks, **gpus,
                    deepspeed_config=dict(deepspeed_config_file="zero3.json", zero3_init_flag=mode == "rank0"))
    fsdp = dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block",
                fsdp_cpu_ram_efficient_loading=mode == "rank0")
    return dict(distributed_type="FSDP", num_processes=ranks, fsdp_config=fsdp, **gpus)


def run(mode, shape, ranks, device, pretrained=None, strategy="fsdp2"):
    with tempfile.TemporaryDirectory(prefix="bench_meta_") as project:
        launch = launch_config(strategy, mode, ranks, device)
        cfg = dict(runners=["bench.meta_start.MetaBenchTrainer"], project_dir=project, launch=launch,
                   dataloaders=dict(train=dict(data_or_config=SyntheticTokens(8 * ranks, shape.seq, shape.vocab),
                                               batch_size_per_gpu=1, num_workers=0)),
                   models=dict(mode=mode, shape=shape.to_dict(), pretrained=pretrained),
                   optimizers=dict(type="SGD", lr=1e-4),  # no optimizer state: the start is what is measured
                   schedulers=dict(type="ConstantScheduler"),
                   train=dict(max_steps=1, log_with="none", progress_bar=False, resume=False,
                              mixed_precision="bf16" if device == "cuda" else "no"))
        launch_from_config(cfg)
        return [json.load(open(os.path.join(project, f"rank_{r}.json"))) for r in range(ranks)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="cpu200", choices=sorted(BENCH_SHAPES))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", default="today,rank0,meta_safetensors")
    parser.add_argument("--strategy", default="fsdp2", choices=("fsdp2", "zero3"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "meta_start.json"))
    args = parser.parse_args()
    shape = replace(BENCH_SHAPES[args.shape], seq=min(BENCH_SHAPES[args.shape].seq, 128), batch=1)
    params = shape.params()
    rows, pretrained_dir = [], tempfile.mkdtemp(prefix="bench_meta_weights_")
    pretrained = None
    if "meta_safetensors" in args.modes:
        from safetensors.torch import save_file
        torch.manual_seed(0)
        pretrained = os.path.join(pretrained_dir, "model.safetensors")
        save_file(Llama(shape).state_dict(), pretrained)
    for mode in args.modes.split(","):
        for r in run(mode, shape, args.ranks, args.device, pretrained, args.strategy):
            rows.append(r)
            print(json.dumps(r), flush=True)
    if pretrained:
        os.remove(pretrained)
    os.rmdir(pretrained_dir)
    result = dict(shape=args.shape, params=params, weights_gb_fp32=round(params * 4 / 2**30, 3), ranks=args.ranks,
                  device=args.device, strategy=args.strategy, torch=torch.__version__, rows=rows)
    print(f"\n{args.shape}: {params / 1e6:.1f}M parameters ({params * 4 / 2**30:.2f} GB fp32), {args.ranks} ranks,"
          f" {args.device}, {args.strategy}\n")
    print("| start | rank | start s | RSS before get_models GB | peak RSS to the model materialised GB"
          " | RSS after sharding GB | peak RSS to there GB | peak RSS after 1 step GB | GPU peak GB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['rank']} | {r['start_s']} | {r['rss_before_model_gb']} | {r['hwm_model_gb']} |"
              f" {r['rss_after_sharding_gb']} | {r['hwm_start_gb']} | {r['hwm_after_step_gb']} |"
              f" {r.get('gpu_peak_gb') or ''} |")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
