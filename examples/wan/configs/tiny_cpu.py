# A Wan transformer of 2 small blocks at random init that trains on CPU in seconds (the test suite's).
# Data: python examples/wan/scripts/build_dataset.py --synthetic 16 --latent-shape 4,3,8,8 \
#           --text-shape 16,32 --out ./experiments/wan_tiny/data
config = dict(
    runners=["examples.wan.trainer.WanTrainer"],
    project_dir="./experiments/wan_tiny",
    launch=dict(distributed_type="NO"),
    dataloaders=dict(train=dict(
        data_or_config=dict(_class_name="WanLatentDataset", root="./experiments/wan_tiny/data", text_len=16),
        batch_size_per_gpu=4,
        num_workers=0,
        sampler=dict(type="DefaultSampler", shuffle=True),
    )),
    models=dict(
        transformer=dict(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=32, freq_dim=16, ffn_dim=48, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64),
        flow_shift=5.0,
        timestep_sampling="uniform",
    ),
    optimizers=dict(type="AdamW", lr=1e-3, weight_decay=0.0),
    schedulers=dict(type="ConstantScheduler"),
    train=dict(
        max_steps=20,
        gradient_accumulation_steps=2,
        max_grad_norm=1.0,
        mixed_precision="no",
        activation_checkpointing=True,
        activation_class_names=["WanTransformerBlock"],
        checkpoint_interval=10,
        checkpoint_total_limit=2,
        resume=True,
        log_with="tensorboard",
        log_interval=5,
        seed=0,
    ),
)
