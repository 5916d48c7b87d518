"""A diffusion-style client (a tiny video-latent denoiser, EMA, the noise and timesteps drawn from torch's
global RNG in forward_step) trained a few steps under whichever `giga_train` this Python imports (GigaTrain
1.1.0 in its venv, or ours), printing JSON: per step the loss, the raw gradient norm and a digest of the
weights, and the final weights and EMA weights as lists.

stdin (JSON): {"out": "result.json", "steps": 6, "lora": false, "bf16": false, "deepspeed": false, "workdir": "/tmp/..."}.
`lora`: get_models freezes the base and adds a low-rank adapter whose init draws from the global RNG (as PEFT's
LoRA does in get_models). `bf16`: the model built in bf16. `deepspeed`: DEEPSPEED (the shipped zero2.json,
train.mixed_precision='bf16', one process over gloo); GigaTrain's Accelerate is given the variables `accelerate
launch` sets and the gloo backend it picks on no CPU (accelerate_deepspeed_on_cpu).
"""
import hashlib
import json
import os
import sys
import tempfile

import torch
from torch import nn

# oneDNN's bf16 Conv3d weight gradient on CPUs with AVX512-BF16 (AMD EPYC here, torch 2.13.0+cpu and
# 2.14.1+cu130 alike) is inf or nan at random (docs/troubleshooting.md, "bf16 Conv3d on the CPU"): both sides run
# torch's own kernels instead, which are deterministic and finite.
torch.backends.mkldnn.enabled = False


class TinyLatents(torch.utils.data.Dataset):
    """Video latents (C=4, T=2, H=W=4) and a conditioning vector, fixed by `seed`."""

    def __init__(self, size=10, seed=0, **unused):
        g = torch.Generator().manual_seed(seed)
        self.latents = torch.randn(size, 4, 2, 4, 4, generator=g)
        self.cond = torch.randn(size, 8, generator=g)
        self.transform = None

    @classmethod
    def load(cls, config):
        return cls(**{k: v for k, v in dict(config).items() if not k.startswith('_')
                      and k not in ('config_path', 'data_path')})

    def set_transform(self, transform):
        self.transform = transform

    def __len__(self):
        return len(self.latents)

    def __getitem__(self, index):
        return dict(index=int(index), latents=self.latents[index], cond=self.cond[index])


class LowRank(nn.Module):
    def __init__(self, base, rank=2):
        super().__init__()
        self.base = base
        self.down = nn.Linear(base.in_features, rank, bias=False)  # kaiming init: draws from the global RNG
        self.up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.up.weight)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


class Denoiser(nn.Module):
    def __init__(self, channels=4, hidden=16, lora=False):
        super().__init__()
        self.conv_in = nn.Conv3d(channels, hidden, 3, padding=1)
        self.time = nn.Linear(1, hidden)
        self.cond = nn.Linear(8, hidden)
        self.conv_out = nn.Conv3d(hidden, channels, 3, padding=1)
        if lora:
            for p in self.parameters():
                p.requires_grad_(False)
            self.cond = LowRank(self.cond)

    def forward(self, noisy, t, cond):
        h = self.conv_in(noisy) + (self.time(t[:, None]) + self.cond(cond))[:, :, None, None, None]
        return self.conv_out(torch.nn.functional.silu(h))


def register():
    try:
        from giga_datasets import register_dataset
    except ImportError:
        import giga_train
        giga_train.DATASETS.register(TinyLatents)
    else:
        register_dataset(TinyLatents)


RECORD = dict(steps=[])


from giga_train import Trainer  # noqa: E402  (GigaTrain's, or ours)


class DenoiserTrainer(Trainer):
    def get_models(self, model_config):
        model = Denoiser(lora=bool(model_config.get('lora', False)))
        if model_config.get('bf16'):  # built in bf16, as projects cast a transformer
            model.to(torch.bfloat16)
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.register_hook(self._grad_hook)
        self._params = params
        return model

    def _grad_hook(self, grad):
        RECORD['steps'][-1]['grad_sq'] += float(grad.double().pow(2).sum())
        return grad

    def forward_step(self, batch_dict):
        dtype = next(self.model.parameters()).dtype
        latents = batch_dict['latents'].to(self.device, dtype)
        cond = batch_dict['cond'].to(self.device, dtype)
        weights = torch.cat([p.detach().float().reshape(-1) for p in self.model.parameters()])
        noise = torch.randn_like(latents)
        t = torch.rand(latents.shape[0], device=latents.device, dtype=dtype)
        noisy = (1 - t)[:, None, None, None, None] * latents + t[:, None, None, None, None] * noise
        pred = self.model(noisy, t, cond)
        loss = (pred - (noise - latents)).float().pow(2).mean()
        RECORD['steps'].append(dict(loss=loss.item(), grad_sq=0.0, indices=[int(i) for i in batch_dict['index']],
                                    weights=hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16]))
        return dict(mse=loss)


def accelerate_deepspeed_on_cpu():
    """GigaTrain 1.1.0 under DEEPSPEED in this one process, on the CPU: the environment `accelerate launch`
    gives a DeepSpeed rank (its zero2.json, the rank variables), and Accelerate's backend choice made gloo
    (it finds no accelerator on a CPU and would run DistributedType.NO)."""
    import socket

    import giga_train
    from accelerate import state
    from accelerate.utils import DistributedType
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    configs = os.path.join(os.path.dirname(giga_train.__file__), 'distributed', 'accelerate_configs')
    os.environ.update(ACCELERATE_USE_DEEPSPEED='true', ACCELERATE_DEEPSPEED_CONFIG_FILE=os.path.join(configs, 'zero2.json'),
                      RANK='0', LOCAL_RANK='0', WORLD_SIZE='1', LOCAL_WORLD_SIZE='1', MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(port))
    state.PartialState._prepare_backend = lambda self, *args, **kwargs: ('gloo', DistributedType.MULTI_CPU)


def run(case):
    register()
    import giga_train
    deepspeed = bool(case.get('deepspeed', False))
    if deepspeed and giga_train.__version__ == '1.1.0':
        accelerate_deepspeed_on_cpu()
    cls = DenoiserTrainer
    workdir = case.get('workdir') or tempfile.mkdtemp(prefix='diffusion-steps-')
    project_dir = os.path.join(workdir, 'project')
    config = dict(
        project_dir=project_dir,
        runners=['diffusion_steps.DenoiserTrainer'],
        launch=dict(distributed_type='DEEPSPEED', deepspeed_config=dict(deepspeed_config_file='zero2.json'))
        if deepspeed else dict(distributed_type='NO'),
        dataloaders=dict(train=dict(data_or_config=dict(_class_name='TinyLatents', size=10, seed=0),
                                    batch_size_per_gpu=2, num_workers=0, transform=None,
                                    sampler=dict(type='DefaultSampler', shuffle=True))),
        models=dict(lora=bool(case.get('lora', False)), bf16=bool(case.get('bf16', False))),
        optimizers=dict(type='AdamW', lr=0.01, weight_decay=0.01),
        schedulers=dict(type='ConstantScheduler'),
        train=dict(max_steps=int(case.get('steps', 6)), log_interval=1, checkpoint_interval=100,
                   checkpoint_safe_serialization=True,
                   with_ema=True, max_grad_norm=case.get('max_grad_norm', 1.0), seed=1234, **(dict(mixed_precision='bf16') if deepspeed else {})),
    )
    from giga_train import load_config
    config = load_config(config)
    trainer = cls.load(config)
    trainer.save_config(config)
    trainer.train()
    for s in RECORD['steps']:
        s['grad_norm'] = s.pop('grad_sq') ** 0.5
    model = trainer.model
    model = getattr(model, 'module', model)
    state = {k: v.detach().float().reshape(-1).tolist() for k, v in model.state_dict().items()}
    masters = {}  # DeepSpeed's fp32 master weights of the trained parameters
    if deepspeed:
        from deepspeed.utils import safe_get_full_fp32_param
        for k, p in model.named_parameters():
            if p.requires_grad:
                masters[k] = safe_get_full_fp32_param(p).reshape(-1).tolist()
    if getattr(trainer, 'ema_models', None):  # GigaTrain's EMAModel list
        ema = trainer.ema_models[0].state_dict()
    else:  # ours: one EMA over the trained module
        ema = trainer.ema.state_dict(model)
    ema_state = {k: v.detach().float().reshape(-1).tolist() for k, v in ema.items()
                 if isinstance(v, torch.Tensor) and v.is_floating_point()}
    saved, live = {}, {}  # the dtypes of the EMA folder GigaTrain's layout writes (<model_name>_ema/), and the rest
    from safetensors import safe_open
    for root, _, files in os.walk(os.path.join(project_dir, 'models')):
        for f in files:
            if f.endswith('.safetensors'):
                with safe_open(os.path.join(root, f), 'pt') as st:
                    dtypes = sorted({str(st.get_slice(k).get_dtype()) for k in st.keys()})
                name = os.path.relpath(os.path.join(root, f), project_dir).split('/', 2)[-1]
                (saved if os.path.basename(root).endswith('_ema') else live)[name] = dtypes
    return dict(steps=RECORD['steps'], weights=state, masters=masters, ema=ema_state,
                ema_dtypes=sorted({str(v.dtype) for v in ema.values() if isinstance(v, torch.Tensor)}),
                ema_files=saved, live_files=live)


if __name__ == '__main__':
    text = sys.stdin.read() if not sys.stdin.isatty() else ''
    case = json.loads(text) if text.strip() else {}
    os.environ.setdefault('CUDA_VISIBLE_DEVICES', '')
    sys.modules['diffusion_steps'] = sys.modules['__main__']  # the config's runner is this module's class
    import giga_train
    result = dict(version=giga_train.__version__, **run(case))
    with open(case['out'], 'w') as f:  # a file: GigaTrain's logger also prints to stdout
        json.dump(result, f)
