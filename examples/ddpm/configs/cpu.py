# A 16x16 DDPM with EMA on CPU: samples/grid in TensorBoard every 100 steps (DDIM, 10 steps, EMA weights).
config = dict(
    runners=["examples.ddpm.trainer.DDPMTrainer"],
    project_dir="./experiments/ddpm_cpu",
    launch=dict(distributed_type="NO"),
    dataloaders=dict(
        train=dict(data_or_config=dict(_class_name="ColouredSquares", num_samples=2048), batch_size_per_gpu=32,
                   num_workers=0, sampler=dict(type="DefaultSampler", shuffle=True)),
        val=dict(data_or_config=dict(_class_name="ColouredSquares", num_samples=64, split="val"),
                 batch_size_per_gpu=32)),
    models=dict(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
                down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                norm_num_groups=8, sample_steps=10, num_samples=4),
    optimizers=dict(type="AdamW", lr=1e-3, weight_decay=0.0),
    schedulers=dict(type="WarmupCosineScheduler", warmup_steps=50, decay_steps=1000, end_value=0.1),
    train=dict(
        max_steps=1000, max_grad_norm=1.0, mixed_precision="no",
        with_ema=True, ema_decay=0.99, eval_interval=100, eval_ema=True,
        checkpoint_interval=500, checkpoint_total_limit=2, resume=True,
        log_with="tensorboard", log_interval=20, seed=0,
    ),
)
