"""`giga-train env`: what a bug report needs, as `accelerate env` prints it: giga-train, Python, the platform,
torch with its CUDA and cuDNN, the GPUs, the versions of the libraries the strategies and examples use, and
the world-size variables of the environment (torchrun, SLURM, Accelerate)."""
import importlib.metadata
import os
import platform
import sys

LIBRARIES = ("deepspeed", "torchao", "triton", "accelerate", "transformers", "diffusers", "peft", "datasets",
             "safetensors", "numpy", "wandb", "tensorboard", "giga-datasets")
ENV_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NNODES",
            "NODE_RANK", "CUDA_VISIBLE_DEVICES", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_NNODES",
            "SLURM_JOB_NUM_NODES", "ACCELERATE_NUM_PROCESSES", "TORCHELASTIC_RESTART_COUNT", "NCCL_DEBUG",
            "WANDB_MODE")


def _version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def env_report():
    """(name, value) rows of the report."""
    from .. import __version__
    rows = [("giga-train", __version__), ("Python", sys.version.split()[0]),
            ("Platform", platform.platform()), ("CPUs", str(os.cpu_count()))]
    try:
        import torch
        rows += [("torch", torch.__version__), ("torch CUDA", str(torch.version.cuda)),
                 ("cuDNN", str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "none"),
                 ("NCCL", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")]
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                rows.append((f"GPU {i}", f"{props.name}, {props.total_memory / 2**30:.1f} GiB,"
                                         f" compute capability {props.major}.{props.minor}"))
        else:
            rows.append(("GPUs", "none visible"))
    except Exception as e:  # a broken torch install is what the report is for
        rows.append(("torch", f"import failed: {type(e).__name__}: {e}"))
    rows += [(name, _version(name)) for name in LIBRARIES]
    rows += [(name, os.environ[name]) for name in ENV_VARS if name in os.environ]
    return rows


def format_env_report(rows):
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"- {name + ':':<{width + 1}} {value}" for name, value in rows)
