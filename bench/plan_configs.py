"""bench/throughput.py's giga job at each bench/llama.py size, as configs for `giga-train plan` (module
attributes: the dotted path names one), e.g.

    giga-train plan bench.plan_configs.llama_8b --set optimizers.type=CAME8Bit \
        --set dataloaders.train.batch_size_per_gpu=8

Defaults as the bench's rows: bf16, AdamW, no compile, the size's micro-batch and checkpointing."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.throughput import giga_config, row_spec  # noqa: E402
from bench.llama import shape_of  # noqa: E402


def bench_config(size):
    config = giga_config(row_spec(size, "giga", steps=2, warmup=1), shape_of(size), torch.device("cpu"),
                         project_dir=f"/tmp/giga_plan_{size}")
    config["launch"] = dict(distributed_type="NO")  # plan computes every strategy; no GPU is named
    return config


llama_1b, llama_8b, llama_13b = (bench_config(size) for size in ("1b", "8b", "13b"))
