"""A diffusion-style client (tests/reference/diffusion_steps.py: a tiny video-latent denoiser with EMA, its noise
and timesteps drawn from torch's global RNG in forward_step) trained 6 steps on the CPU by the real GigaTrain
1.1.0 (its own venv) and by giga-train from the same seed: the losses, the gradient norms, the weights before
every step, the final weights and the EMA are equal to the last bit, in fp32 and with a model built in bf16
(the EMA then kept and written in bf16, as GigaTrain's). In LoRA mode (get_models draws the adapter's init from
the global RNG) too; the frozen base weights' fp32 EMA is GigaTrain's within 1 ulp (GigaTrain also averages
frozen weights, whose fp32 rounding moves them; ours keeps them as they are).

Under DEEPSPEED (ZeRO-2, bf16, one process over gloo; GigaTrain's Accelerate given what `accelerate launch`
would set) the same, plus DeepSpeed's fp32 master weights: both sides run DeepSpeed's own engine, optimizer
wrapper and clipping on the same gradients, so the masters are asserted bit-equal, not within a tolerance
(DeepSpeed clips at 1.0 by default, GigaTrain's max_grad_norm unread; ours fills it from max_grad_norm=1.0).
The EMA folder holds every tensor in the dtype the model was built in (fp32 here), frozen ones included, as
GigaTrain's EMAModel (DeepSpeed's module holds them in bf16); the root model.safetensors (the live weights)
in the module's bf16, as GigaTrain writes DeepSpeed's model folders."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.ref_compare import reference_python

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference", "diffusion_steps.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record(python, tmp_path, name, **case):
    out = str(tmp_path / f"{name}.json")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=ROOT if python == sys.executable else "", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    if python != sys.executable:  # DeepSpeed's ops built by the reference venv's torch, in the venv: torch
        # 2.13's extension builder waits forever on the lock file another torch's builder leaves behind
        env["TORCH_EXTENSIONS_DIR"] = os.path.join(os.path.dirname(os.path.dirname(python)), "torch_extensions")
    proc = subprocess.run([python, SCRIPT], input=json.dumps(dict(case, out=out, workdir=str(tmp_path / name))),
                          cwd="/", env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("lora, bf16, deepspeed", [(False, False, False), (True, True, False),
                                                   (False, False, True), (True, False, True)],
                         ids=["NO", "NO-lora-bf16", "DEEPSPEED", "DEEPSPEED-lora"])
def test_same_seed_same_numbers_as_gigatrain(tmp_path, lora, bf16, deepspeed):
    if deepspeed:
        pytest.importorskip("deepspeed")
    case = dict(steps=6, lora=lora, bf16=bf16, deepspeed=deepspeed)
    ref = record(reference_python(), tmp_path, "ref", **case)
    ours = record(sys.executable, tmp_path, "ours", **case)
    assert ref["version"] == "1.1.0" and ours["version"] != "1.1.0"
    assert len(ref["steps"]) == len(ours["steps"]) == 6
    for key in ("indices", "weights", "loss", "grad_norm"):  # weights: a digest of all of them before the step
        assert [s[key] for s in ours["steps"]] == [s[key] for s in ref["steps"]], key
    assert ours["weights"] == ref["weights"]
    assert ours["masters"] == ref["masters"] and bool(ref["masters"]) == deepspeed  # DeepSpeed's fp32 masters
    trained = {k for k in ref["ema"] if not lora or k.startswith("cond.down") or k.startswith("cond.up")}
    assert {k: ours["ema"][k] for k in trained} == {k: ref["ema"][k] for k in trained}
    # the EMA in the dtype the model was built in (GigaTrain's EMAModel keeps it so), in memory and in <name>_ema/
    assert ours["ema_dtypes"] == ref["ema_dtypes"] == ["torch.bfloat16" if bf16 else "torch.float32"]
    assert ours["ema_files"] == ref["ema_files"] and ref["ema_files"]
    # the live weights with EMA on: GigaTrain's Accelerate writes model.safetensors in the module's dtype, and
    # under DeepSpeed none (they are in its pytorch_model/ only); ours always, in the module's dtype (bf16 there)
    module_dtype = "BF16" if bf16 or deepspeed else "F32"
    assert ours["live_files"] == {"model.safetensors": [module_dtype]}
    assert ref["live_files"] == ({} if deepspeed else ours["live_files"])
    for k in set(ref["ema"]) - trained:  # frozen: GigaTrain's fp32 rounding of a constant average
        assert torch.allclose(torch.tensor(ours["ema"][k]), torch.tensor(ref["ema"][k]), rtol=1.2e-7, atol=1e-9), k
        assert ours["ema"][k] == ours["weights"][k]  # ours: exactly the frozen weights
