# The same fine-tuning under FSDP2: one fully_shard per WanTransformerBlock, then the root.
# Activation checkpointing stays on WanTransformerBlock: here it wraps the block's forward before
# sharding, so the seed's FSDP2 workaround (checkpointing WanAttention and FeedForward) is not needed.
from examples.wan.configs.wan_5b_t2v_ft import config as _deepspeed

config = dict(
    _deepspeed,
    project_dir="./experiments/wan_5b_t2v_ft_fsdp2",
    launch=dict(
        gpu_ids=[0, 1, 2, 3, 4, 5, 6, 7],
        distributed_type="FSDP",
        fsdp_config=dict(
            fsdp_version=2,
            fsdp_auto_wrap_policy="TRANSFORMER_BASED_WRAP",
            fsdp_transformer_layer_cls_to_wrap="WanTransformerBlock",
            fsdp_cpu_ram_efficient_loading=False,
            fsdp_state_dict_type="FULL_STATE_DICT",
        ),
    ),
)
