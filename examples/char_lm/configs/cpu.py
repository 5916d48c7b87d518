# The CPU demo: a 0.8M-parameter byte-level GPT on the Python standard library's sources.
config = dict(
    runners=["examples.char_lm.trainer.CharLMTrainer"],
    project_dir="./experiments/char_lm_cpu",
    launch=dict(distributed_type="NO"),
    dataloaders=dict(train=dict(
        data_or_config=dict(_class_name="StdlibText", block_size=128, stride=64, max_bytes=2_000_000),
        batch_size_per_gpu=32,
        num_workers=0,
        sampler=dict(type="DefaultSampler", shuffle=True),
    )),
    models=dict(vocab_size=256, block_size=128, dim=128, layers=4, heads=4, dropout=0.0),
    optimizers=dict(type="AdamW", lr=2e-3, weight_decay=0.01, betas=(0.9, 0.95)),
    schedulers=dict(type="WarmupCosineScheduler", warmup_steps=30, decay_steps=400, end_value=0.1),
    train=dict(
        max_steps=400,
        gradient_accumulation_steps=1,
        max_grad_norm=1.0,
        mixed_precision="no",
        checkpoint_interval=100,
        checkpoint_total_limit=2,
        resume=True,
        log_with="tensorboard",
        log_interval=20,
        seed=42,
    ),
)
