# Wan2.2-TI2V-5B text-to-video fine-tuning on 8 GPUs with DeepSpeed ZeRO-2 (the seed's config).
# Data: python examples/wan/scripts/build_dataset.py --videos DIR --vae W --text-encoder W --out data/wan_t2v
# (W: a local Wan2.2-TI2V-5B-Diffusers folder). Weights: models.pretrained=W; without it, random init.
from examples.wan.model import WAN22_TI2V_5B

config = dict(
    runners=["examples.wan.trainer.WanTrainer"],
    project_dir="./experiments/wan_5b_t2v_ft",
    launch=dict(
        gpu_ids=[0, 1, 2, 3, 4, 5, 6, 7],
        distributed_type="DEEPSPEED",
        deepspeed_config=dict(deepspeed_config_file="accelerate_configs/zero2.json"),
    ),
    dataloaders=dict(train=dict(
        data_or_config=dict(_class_name="WanLatentDataset", root="./data/wan_t2v", text_len=512),
        batch_size_per_gpu=1,
        num_workers=2,
        sampler=dict(type="DefaultSampler", shuffle=True),
    )),
    models=dict(
        pretrained=None,                 # e.g. "/models/Wan2.2-TI2V-5B-Diffusers" (local only)
        transformer=WAN22_TI2V_5B,       # the architecture when pretrained is None
        flow_shift=5.0,                  # Wan's shift for 480p/720p
        timestep_sampling="uniform",
    ),
    # The seed's optimizer. Under ZeRO each rank's flat partition is mapped back to the 2-D weights it covers,
    # so the row/column factors are the whole weights' (~1 byte/param of state, not GigaTrain's fp32 fallback).
    optimizers=dict(type="CAME8Bit", lr=2e-5, betas=(0.9, 0.999, 0.9999), weight_decay=0.01),
    schedulers=dict(type="ConstantScheduler"),
    train=dict(
        max_steps=10000,
        gradient_accumulation_steps=1,
        max_grad_norm=1.0,
        mixed_precision="bf16",
        activation_checkpointing=True,
        activation_class_names=["WanTransformerBlock"],
        checkpoint_interval=500,
        checkpoint_total_limit=3,
        resume=True,
        log_with="tensorboard",
        log_interval=1,
        seed=42,
    ),
)
