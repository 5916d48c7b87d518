# Wan2.2-TI2V-5B at its native 720p x 121 frames (704x1280: latents 48x31x44x80, 27,280 tokens per sample)
# on 8 GPUs: FSDP2 over all 8, each sample's sequence split over 4 GPUs (Ulysses sequence parallelism:
# 24 heads / 4), so 2 samples per step (dp_shard_size 2 x sp_size 4). On 16 GPUs (2 machines) add
# dp_replicate_size=2 (HSDP: shards stay inside a machine, one gradient all-reduce crosses).
# Data: python examples/wan/scripts/build_dataset.py --videos DIR --vae W --text-encoder W --frames 121
# --height 704 --width 1280 --out data/wan_t2v_720p (or --synthetic 8 for a dry run).
# Plan first: giga-train plan examples/wan/configs/wan_5b_720p_sp.py --gpus 8 --sp 1,2,4,8
from examples.wan.configs.wan_5b_t2v_ft import config as _base

config = dict(
    _base,
    project_dir="./experiments/wan_5b_720p_sp",
    launch=dict(
        gpu_ids=[0, 1, 2, 3, 4, 5, 6, 7],
        distributed_type="FSDP",
        fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="WanTransformerBlock"),
        parallelism_config=dict(dp_shard_size=2, sp_size=4, sp_backend="ulysses"),
    ),
    dataloaders=dict(train=dict(_base["dataloaders"]["train"], data_or_config=dict(
        _class_name="WanLatentDataset", root="./data/wan_t2v_720p", text_len=512))),
)
