# The char-LM on one GPU with bf16 autocast: a 19M-parameter byte-level GPT.
from examples.char_lm.configs.cpu import config as _cpu

config = dict(
    _cpu,
    project_dir="./experiments/char_lm_gpu",
    launch=dict(gpu_ids=[0], distributed_type="NO"),
    dataloaders=dict(train=dict(
        data_or_config=dict(_class_name="StdlibText", block_size=256, stride=128, max_bytes=20_000_000),
        batch_size_per_gpu=64,
        num_workers=2,
        sampler=dict(type="DefaultSampler", shuffle=True),
    )),
    models=dict(vocab_size=256, block_size=256, dim=512, layers=6, heads=8, dropout=0.1),
    optimizers=dict(type="AdamW", lr=1e-3, weight_decay=0.05, betas=(0.9, 0.95), fused=True),
    schedulers=dict(type="WarmupCosineScheduler", warmup_steps=100, decay_steps=2000, end_value=0.1),
    train=dict(_cpu["train"], max_steps=2000, mixed_precision="bf16", checkpoint_interval=500,
               checkpoint_total_limit=2, log_interval=50),
)
