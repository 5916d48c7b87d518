"""GigaTrain 1.1's config keys, with its meaning: every section's keys are accepted and normalised into the values
our code reads (Accelerate's string forms, -1/0 sentinels, list forms), extra train/test keys become kwargs, and
a near miss of a known key is still an error. Config checks only: nothing is trained here."""
import math

import pytest

from giga_train import ConfigError, load_config
from giga_train.cli import main
from giga_train.launch.runners import validated_runners
from giga_train.schema import TRAIN, checkpoint_steps, edit_distance, near_miss, resolve_logging_dir, train_kwargs
from giga_train.schema import tester_kwargs as kwargs_of_test
from giga_train.compat.accelerate import normalise_deepspeed, normalise_fsdp
from tests.tiny import tiny_config


def checked(tmp_path, launch=None, **train):
    cfg = tiny_config(tmp_path / "run", **train)
    if launch is not None:
        cfg["launch"] = launch
    cfg = load_config(cfg)
    validated_runners(cfg)
    return cfg


def checked_config(cfg):
    """The config as validation fills it."""
    cfg = load_config(cfg)
    result = validated_runners(cfg)
    return result if isinstance(result, dict) and "dataloaders" in result else cfg


def refused(tmp_path, message, launch=None, edit=None, **train):
    cfg = tiny_config(tmp_path / "run", **train)
    if launch is not None:
        cfg["launch"] = launch
    if edit:
        edit(cfg)
    with pytest.raises(ConfigError) as info:
        validated_runners(load_config(cfg))
    text = str(info.value)
    assert message in text and "\n" not in text, text
    return text


# ------------------------------------------------------------------------------------------------------ train
def test_gigatrain_sentinels_mean_not_set(tmp_path):
    cfg = checked(tmp_path, max_epochs=0, max_steps=20, checkpoint_total_limit=-1, checkpoint_interval=5,
                  mixed_precision=None, checkpoint_keeps=None, activation_class_names=None)
    t = cfg.train
    assert t.max_epochs is None and t.max_steps == 20
    assert t.checkpoint_total_limit is None and t.checkpoint_interval == 5
    assert t.mixed_precision is None and t.checkpoint_keeps == [] and t.activation_class_names == []
    cfg = checked(tmp_path, max_steps=0, max_epochs=2, checkpoint_total_limit=0)
    assert cfg.train.max_steps is None and cfg.train.max_epochs == 2 and cfg.train.checkpoint_total_limit is None
    refused(tmp_path, "train: set max_steps (5) or max_epochs (2), not both", max_steps=5, max_epochs=2)
    refused(tmp_path, "train: set max_steps or max_epochs", max_steps=0)


def test_checkpoint_interval_counts_epochs_when_training_by_epochs(tmp_path):
    cfg = checked(tmp_path, max_steps=None, max_epochs=4, checkpoint_interval=0.5)
    assert cfg.train.checkpoint_interval == 0.5  # half an epoch: the trainer turns it into steps
    cfg = checked(tmp_path, max_steps=None, max_epochs=4, checkpoint_total_limit=2)
    assert cfg.train.checkpoint_interval is None  # GigaTrain's default: every epoch (checkpoint_steps)
    assert checkpoint_steps(cfg.train, epoch_size=6) == 6
    cfg = checked(tmp_path, max_steps=40, checkpoint_interval=10.0)
    assert cfg.train.checkpoint_interval == 10 and isinstance(cfg.train.checkpoint_interval, int)
    refused(tmp_path, "train.checkpoint_interval: 2.5 steps is not a whole number", checkpoint_interval=2.5)
    by_epochs = checked(tmp_path, max_steps=None, max_epochs=4, checkpoint_interval=0.5).train
    assert checkpoint_steps(by_epochs, epoch_size=10) == 5 and checkpoint_steps(by_epochs, epoch_size=1) == 1
    by_epochs.checkpoint_interval = 3  # >= max_epochs is still epochs here (GigaTrain would read 3 steps)
    by_epochs.max_epochs = 1
    assert checkpoint_steps(by_epochs, epoch_size=10) == 30
    assert checkpoint_steps(checked(tmp_path, checkpoint_interval=7).train, epoch_size=10) == 7
    assert checkpoint_steps(checked(tmp_path).train, epoch_size=10) is None
    refused(tmp_path, "train.checkpoint_interval: must be > 0", checkpoint_interval=0)


@pytest.mark.parametrize("value, trackers", [("tensorboard", ["tensorboard"]), ("wandb", ["wandb"]),
                                             (["tensorboard", "wandb"], ["tensorboard", "wandb"]),
                                             (None, []), ("none", []), ([], []), ("TensorBoard", ["tensorboard"])])
def test_log_with_is_a_name_or_a_list(tmp_path, value, trackers):
    assert checked(tmp_path, log_with=value).train.log_with == trackers


def test_log_with_unknown_tracker(tmp_path):
    refused(tmp_path, "train.log_with: 'tensorbord' is not supported (choose from tensorboard, jsonl, wandb,"
                      " all, none); did you mean 'tensorboard'?", log_with="tensorbord")
    refused(tmp_path, "train.log_with: 'comet_ml' is not supported", log_with=["tensorboard", "comet_ml"])


def test_every_gigatrain_trainer_keyword_is_accepted(tmp_path):
    """Trainer.__init__ of GigaTrain 1.1, every keyword with a non-default value."""
    cfg = checked(tmp_path, max_epochs=0, max_steps=30, gradient_accumulation_steps=2, mixed_precision="bf16",
                  dynamo_config=None, ddp_config=dict(find_unused_parameters=True, static_graph=False,
                                                      comm_hook="bf16", bucket_cap_mb=50),
                  fp8_config=None, data_parallel_size=2, log_with=["tensorboard"], log_interval=3,
                  log_cpu_memory=False, checkpoint_interval=10, checkpoint_total_limit=-1, checkpoint_keeps=[20],
                  checkpoint_save_optimizer=False, checkpoint_safe_serialization=False, checkpoint_strict=False,
                  activation_checkpointing=True, activation_class_names=["Block"], with_ema=True,
                  allow_tf32=False, seed=6666, logging_dir="/tmp/somewhere/logs",
                  # its kwargs conventions
                  max_grad_norm=1.0, grad_norm_type="inf", loss_nan_total_limit=50, resume=True)
    t = cfg.train
    assert t.ddp_config.find_unused_parameters and t.data_parallel_size == 2 and not t.log_cpu_memory
    assert not t.checkpoint_save_optimizer and not t.allow_tf32 and t.logging_dir == "/tmp/somewhere/logs"
    assert t.grad_norm_type == math.inf and t.max_nan_steps == 51  # GigaTrain stops at the 51st NaN step
    # GigaTrain's Trainer reads these from self.kwargs: they are there in ours too
    assert train_kwargs(t) == dict(max_grad_norm=1.0, grad_norm_type=math.inf, loss_nan_total_limit=50, resume=True)


def test_defaults_and_seed(tmp_path):
    cfg = tiny_config(tmp_path / "run")
    del cfg["train"]["seed"]
    cfg = load_config(cfg)
    validated_runners(cfg)
    t = cfg.train
    assert t.seed == 6666  # GigaTrain's default, so an unchanged GigaTrain config draws the same numbers
    assert t.allow_tf32 and t.log_cpu_memory and t.checkpoint_save_optimizer and t.data_parallel_size == 1
    assert t.grad_norm_type is None and t.max_nan_steps == 10 and t.checkpoint_safe_serialization  # None: 2-norm
    assert train_kwargs(t) == {}  # GigaTrain's self.kwargs holds only what the config gives


def test_loss_nan_total_limit_maps_onto_max_nan_steps(tmp_path):
    assert checked(tmp_path, loss_nan_total_limit=-1).train.max_nan_steps is None  # <= 0: never stop
    assert checked(tmp_path, loss_nan_total_limit=7, max_nan_steps=8).train.max_nan_steps == 8
    refused(tmp_path, "train: loss_nan_total_limit and max_nan_steps disagree", loss_nan_total_limit=7,
            max_nan_steps=3)


def test_ddp_config_keys_are_checked(tmp_path):
    refused(tmp_path, "train.ddp_config: unknown key 'find_unused_parameter'; did you mean 'find_unused_parameters'?",
            ddp_config=dict(find_unused_parameter=True))
    refused(tmp_path, "train.ddp_config: comm_hook: 'int8' is not one of", ddp_config=dict(comm_hook="int8"))


def test_fp8_config_in_gigatrains_transformer_engine_form_is_refused(tmp_path):
    refused(tmp_path, "train.fp8_config.backend: 'te' (Transformer Engine) is not used",
            fp8_config=dict(backend="te", recipe_kwargs=dict()))


def test_logging_dir_follows_gigatrains_rule(tmp_path):
    assert resolve_logging_dir("/p/run/", None, {}) == "/p/run/logs"
    assert resolve_logging_dir("/p/run", None, {"AIHC_TENSORBOARD_LOG_PATH": ""}) == "/p/run/logs"
    assert resolve_logging_dir("/p/run", None, {"AIHC_TENSORBOARD_LOG_PATH": "/tb/x"}) == "/tb/x"
    assert resolve_logging_dir("/p/run", "/mine", {"AIHC_TENSORBOARD_LOG_PATH": "/tb/x"}) == "/mine"
    cfg = checked(tmp_path)
    assert cfg.train.logging_dir == str(tmp_path / "run" / "logs") == cfg.test.logging_dir


# ---------------------------------------------------------------------------------------- kwargs and typos
# Extra keys seen in public GigaTrain projects and forks (e.g. sp_size in a sequence-parallel fork): kwargs.
REAL_EXTRA_KEYS = ["sp_size", "episodes", "lora_rank", "train_mode", "view_interval", "ema_update_every",
                   "eval_interval", "use_lora", "save_video", "num_inference_steps", "result"]


@pytest.mark.parametrize("key", REAL_EXTRA_KEYS)
def test_extra_train_keys_become_kwargs(tmp_path, key):
    cfg = checked(tmp_path, **{key: 1})
    assert cfg.train[key] == 1 and train_kwargs(cfg.train)[key] == 1


# (typo, the known key it must be reported as): one edit, two edits on long names, a swap
TYPOS = [("max_step", "max_steps"), ("checkpoint_keep", "checkpoint_keeps"), ("checkpoint_kepes", "checkpoint_keeps"),
         ("ema_decai", "ema_decay"), ("emadecay", "ema_decay"), ("max_grad_nrom", "max_grad_norm"),
         ("max_grad_norms", "max_grad_norm"), ("maxgrad_norm", "max_grad_norm"), ("grad_norm_typ", "grad_norm_type"),
         ("loss_nan_total_limt", "loss_nan_total_limit"), ("mixed_precison", "mixed_precision"),
         ("checkpoint_interal", "checkpoint_interval"), ("with_emma", "with_ema"), ("sead", "seed"),
         ("resum", "resume"), ("log_intervals", "log_interval"), ("allow_tf23", "allow_tf32"),
         ("checkpoint_total_limits", "checkpoint_total_limit"), ("log_cpu_mem0ry", "log_cpu_memory")]


@pytest.mark.parametrize("typo, known", TYPOS, ids=[t for t, _ in TYPOS])
def test_a_near_miss_is_an_error_naming_the_known_key(tmp_path, typo, known):
    refused(tmp_path, f"train.{typo}: unknown key; did you mean '{known}'?", **{typo: 1})


def test_the_threshold_on_both_sides():
    # within reach: one edit on any name, two on names of 7+ characters
    assert near_miss("seeds", TRAIN) == "seed" and near_miss("speed", TRAIN) == "seed" and near_miss("max_grad_nrm", TRAIN) == "max_grad_norm"
    assert near_miss("checkpoint_kep", TRAIN) == "checkpoint_keeps"
    # out of reach: two edits on a short name, three on a long one, and the real projects' extra keys
    assert near_miss("result", TRAIN) is None and edit_distance("result", "resume") == 2
    assert near_miss("max_grad_value", TRAIN) is None and near_miss("ema_decay_rate", TRAIN) is None
    assert near_miss("sp_size", TRAIN) is None and near_miss("steps", TRAIN) is None
    assert all(near_miss(k, TRAIN) is None for k in REAL_EXTRA_KEYS)
    assert edit_distance("ab", "ba") == 1 and edit_distance("kitten", "sitting") == 3


def test_project_dir_in_train_is_refused(tmp_path):
    refused(tmp_path, "train.project_dir: set project_dir at the top level",
            edit=lambda c: c["train"].update(project_dir="/x"))


def test_test_section_is_the_testers_keywords(tmp_path):
    def add_test(cfg):
        cfg["test"] = dict(mixed_precision=None, log_interval=5, seed=1, logging_dir=None, num_samples=4,
                           save_video=True)
        cfg["dataloaders"]["test"] = dict(data_or_config=dict(_class_name="CountingDataset", size=8),
                                          batch_size_per_gpu=2)
        cfg["models"] = dict(cfg["models"], test=dict(dim=16))
    cfg = tiny_config(tmp_path / "run")
    add_test(cfg)
    cfg = load_config(cfg)
    validated_runners(cfg)
    assert cfg.test.mixed_precision == "no" and cfg.test.log_interval == 5
    assert kwargs_of_test(cfg.test) == dict(num_samples=4, save_video=True)
    assert cfg.dataloaders.test.batch_size_per_gpu == 2 and cfg.models.test.dim == 16
    refused(tmp_path, "test.log_intervall: unknown key; did you mean 'log_interval'?",
            edit=lambda c: c.update(test=dict(log_intervall=3)))
    assert checked(tmp_path).test.seed == 6666  # absent: GigaTrain's defaults


# ------------------------------------------------------------------------------------------------ dataloaders
def test_dataloader_keys_of_gigatrains_get_dataloaders(tmp_path):
    def edit(cfg):
        loader = cfg["dataloaders"]["train"]
        loader.update(filter=dict(mode="overall_func", func="tests.test_gigatrain_config.keep_all", min_size=1),
                      collator=dict(is_equal=True), pin_memory=True)
        cfg["dataloaders"]["test"] = dict()  # GigaTrain configs write an empty placeholder
        cfg["dataloaders"]["eval"] = None
    cfg = tiny_config(tmp_path / "run")
    edit(cfg)
    cfg = load_config(cfg)
    validated_runners(cfg)
    assert cfg.dataloaders.train.collator.is_equal and "eval" not in cfg.dataloaders
    assert cfg.dataloaders.test.data_or_config is None
    refused(tmp_path, "dataloaders.train.filter.func: cannot import 'tests.nowhere.f'",
            edit=lambda c: c["dataloaders"]["train"].update(filter=dict(func="tests.nowhere.f")))
    refused(tmp_path, "dataloaders.train: give collator (GigaTrain's) or collate_fn, not both",
            edit=lambda c: c["dataloaders"]["train"].update(collator={}, collate_fn="torch.stack"))
    refused(tmp_path, "dataloaders.train: give sampler or batch_sampler, not both",
            edit=lambda c: c["dataloaders"]["train"].update(batch_sampler=dict(type="DefaultSampler")))
    refused(tmp_path, "dataloaders.train.colator: unknown key; did you mean 'collator'?",
            edit=lambda c: c["dataloaders"]["train"].update(colator={}))


def keep_all(all_data_list, **kwargs):
    return all_data_list


@pytest.mark.parametrize("data", ["/data/packed", ["/data/a", "/data/b"],
                                  [dict(_class_name="CountingDataset", size=4), "/data/b"]])
def test_data_or_config_forms_pass_the_checks_unchanged(tmp_path, data):
    """A folder, a list of folders, a list of a config and a folder: accepted as written (a folder is opened
    when the loader is built, by giga_datasets)."""
    cfg = tiny_config(tmp_path / "run")
    cfg["dataloaders"]["train"]["data_or_config"] = data
    cfg = checked_config(cfg)
    assert cfg.dataloaders.train.data_or_config == data


def test_data_or_config_forms_open_as_gigatrain_opens_them(tmp_path):
    """Our datasets by config, alone or as a list (a ConcatDataset of them); a missing folder is one line; a
    folder needs giga_datasets, named in one line when it cannot be imported."""
    import importlib.util

    import torch

    from giga_train.data.loader import build_dataset
    one = build_dataset(dict(_class_name="CountingDataset", size=4))
    assert [int(one[i]["index"]) for i in range(len(one))] == [0, 1, 2, 3]
    both = build_dataset([dict(_class_name="CountingDataset", size=4), dict(type="CountingDataset", size=2)])
    if importlib.util.find_spec("giga_datasets") is None:
        assert type(both) is torch.utils.data.ConcatDataset
    assert len(both) == 6 and [int(both[i]["index"]) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ConfigError, match=r"^data_or_config\[1\]: no dataset folder or config file '/data/b'$"):
        build_dataset([dict(_class_name="CountingDataset", size=4), "/data/b"])
    if importlib.util.find_spec("giga_datasets") is None:
        with pytest.raises(ConfigError, match="data_or_config: needs the giga-datasets package"):
            build_dataset(str(tmp_path))


def test_data_or_config_bad_forms(tmp_path):
    refused(tmp_path, "dataloaders.train.data_or_config: an empty list names no dataset",
            edit=lambda c: c["dataloaders"]["train"].update(data_or_config=[]))
    refused(tmp_path, "dataloaders.train.data_or_config[1]: expected a dataset folder",
            edit=lambda c: c["dataloaders"]["train"].update(data_or_config=["/a", 3]))


def test_a_runner_with_its_own_get_dataloaders_keeps_its_loader_keys(tmp_path):
    cfg = tiny_config(tmp_path / "run", runner="tests.test_gigatrain_config.OwnLoaders")
    cfg["dataloaders"]["train"]["dataset"] = dict(type="ExpDataset", data_path_list=["/x"])
    cfg = load_config(cfg)
    validated_runners(cfg)
    assert cfg.dataloaders.train.dataset.type == "ExpDataset"
    refused(tmp_path, "dataloaders.train.dataset: unknown key",
            edit=lambda c: c["dataloaders"]["train"].update(dataset={}))  # TinyTrainer reads no such key


from tests.tiny import TinyTrainer  # noqa: E402


class OwnLoaders(TinyTrainer):
    def get_dataloaders(self, data_config):  # GigaTrain's hook: this runner reads its own loader keys
        return super().get_dataloaders(data_config)


# ----------------------------------------------------------------------------------------------------- launch
def test_launch_keys_of_gigatrains_launcher(tmp_path):
    cfg = checked(tmp_path, launch=dict(distributed_type="NO", until_completion=True, num_cpu_threads_per_process=4,
                                        nccl_socket_ifname="eth0", env=dict(A="1"), executable="/usr/bin/accelerate",
                                        save_config_path="_tmp/c.json", save_hostfile_path="_tmp/h",
                                        main_process_port=1234, rdzv_backend="static", same_network=True,
                                        main_training_function="main", downcast_bf16=False, enable_cpu_affinity=False,
                                        mpirun_config={}, megatron_lm_config={}))
    l = cfg.launch  # noqa: E741
    assert l.until_completion and l.num_cpu_threads_per_process == 4 and l.nccl_socket_ifname == "eth0"
    assert l.env == dict(A="1") and l.num_machines == 1


def test_main_process_ip_list_gives_num_machines(tmp_path):
    cfg = checked(tmp_path, launch=dict(distributed_type="DDP", num_processes=2,
                                        main_process_ip=["10.0.0.1", "10.0.0.2"], machine_rank=1))
    assert cfg.launch.num_machines == 2 and cfg.launch.main_process_ip == "10.0.0.1"
    refused(tmp_path, "launch.num_machines=3 but main_process_ip lists 2 machines",
            launch=dict(distributed_type="DDP", main_process_ip=["a", "b"], num_machines=3))
    refused(tmp_path, "launch.machine_rank=2 but num_machines=2",
            launch=dict(distributed_type="DDP", main_process_ip=["a", "b"], machine_rank=2))


def test_gpu_ids_per_machine(tmp_path, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    cfg = checked(tmp_path, launch=dict(distributed_type="DEEPSPEED", gpu_ids=[[0, 1], [2, 3]], machine_rank=1,
                                        main_process_ip=["10.0.0.1", "10.0.0.2"], nccl_socket_ifname="ib0",
                                        deepspeed_config=dict(deepspeed_config_file="zero2.json")))
    assert cfg.launch.gpu_ids == [2, 3] and cfg.launch.num_machines == 2
    refused(tmp_path, "launch.gpu_ids: 2 lists for 1 machines", launch=dict(gpu_ids=[[0], [1]]))
    refused(tmp_path, "launch.gpu_ids: every machine must run as many ranks, got [2, 1]",
            launch=dict(gpu_ids=[[0, 1], [2]], main_process_ip=["a", "b"]))
    cfg = checked(tmp_path, launch=dict(gpu_ids=[0, 1]))
    assert cfg.launch.distributed_type == "DDP"  # GigaTrain's default for several ranks: MULTI_GPU
    assert checked(tmp_path, launch=dict(gpu_ids=[0])).launch.distributed_type == "NO"
    assert checked(tmp_path, launch=dict(gpu_ids=[0, 1], distributed_type="multi_gpu")).launch.distributed_type \
        == "MULTI_GPU"


@pytest.mark.parametrize("key, value, message", [
    ("tpu_name", "x", "launch.tpu_name: TPU only; remove it"),
    ("parallelism_config", dict(parallelism_config_tp_size=2), "launch.parallelism_config.tp_size=2: tensor parallelism"),
    ("megatron_lm_config", dict(megatron_lm_tp_degree=2), "launch.megatron_lm_config: Megatron-LM"),
    ("fp8_config", dict(fp8_backend="TE"), "launch.fp8_config: fp8 is a train setting here"),
    ("enable_cpu_affinity", True, "launch.enable_cpu_affinity: pinning ranks"),
    ("mixed_precision", "bf16", "launch.mixed_precision: not a launch key (set train.mixed_precision)"),
    ("use_cpu", True, "launch.use_cpu: not a launch key"),
    ("rdzv_backend", "etcd", "launch.rdzv_backend: 'etcd' is not one of"),
    ("main_proces_ip", "x", "launch.main_proces_ip: unknown key; did you mean 'main_process_ip'?"),
])
def test_cluster_keys_we_do_not_run_are_refused(tmp_path, key, value, message):
    refused(tmp_path, message, launch={"distributed_type": "NO", key: value})


def test_launch_dynamo_config_becomes_train_dynamo_config(tmp_path):
    cfg = checked(tmp_path, launch=dict(distributed_type="NO", dynamo_config=dict(
        dynamo_backend="INDUCTOR", dynamo_mode="default", dynamo_use_fullgraph="false",
        dynamo_use_regional_compilation=True)))
    assert cfg.train.dynamo_config == dict(backend="inductor", mode="default", fullgraph=False,
                                           use_regional_compilation=True)
    cfg = checked(tmp_path, launch=dict(distributed_type="NO", dynamo_config=dict(dynamo_backend="NO")))
    assert cfg.train.dynamo_config is None


# ------------------------------------------------------------------------------------------------------- FSDP
def test_fsdp_config_in_accelerates_string_forms(tmp_path):
    """giga-brain-0's fsdp_config, as shipped."""
    cfg = checked(tmp_path, launch=dict(distributed_type="FSDP", num_processes=2, fsdp_config=dict(
        fsdp_version="2", fsdp_auto_wrap_policy="TRANSFORMER_BASED_WRAP",
        fsdp_transformer_layer_cls_to_wrap="Block,Other", fsdp_cpu_ram_efficient_loading="false",
        fsdp_state_dict_type="FULL_STATE_DICT")))
    f = cfg.launch.fsdp_config
    assert f.fsdp_version == 2 and f.fsdp_cpu_ram_efficient_loading is False
    assert f.fsdp_transformer_layer_cls_to_wrap == ["Block", "Other"] and f.fsdp_reshard_after_forward is True


@pytest.mark.parametrize("given, expected", [
    (dict(fsdp_version=1), dict(fsdp_version=1)),
    (dict(version="1"), dict(fsdp_version=1)),  # Accelerate adds the fsdp_ prefix itself
    (dict(fsdp_sharding_strategy="SHARD_GRAD_OP"), dict(fsdp_reshard_after_forward=False)),
    (dict(fsdp_sharding_strategy=1), dict(fsdp_reshard_after_forward=True)),  # torch's enum value: FULL_SHARD
    (dict(fsdp_sharding_strategy="2"), dict(fsdp_reshard_after_forward=False)),
    (dict(fsdp_reshard_after_forward="false"), dict(fsdp_reshard_after_forward=False)),
    (dict(fsdp_version=1, fsdp_reshard_after_forward="FULL_SHARD"), dict(fsdp_reshard_after_forward=True)),
    (dict(fsdp_auto_wrap_policy="no_wrap"), dict(fsdp_auto_wrap_policy="NO_WRAP")),
    (dict(fsdp_state_dict_type="sharded_state_dict"), dict(fsdp_state_dict_type="SHARDED_STATE_DICT")),
    (dict(fsdp_offload_params="false", fsdp_use_orig_params="true", fsdp_sync_module_states="true",
          fsdp_forward_prefetch="false", fsdp_backward_prefetch="BACKWARD_PRE", fsdp_min_num_params=0,
          fsdp_activation_checkpointing_offload="false", fsdp_ignored_modules=None), {}),
    (dict(fsdp_backward_prefetch="NO_PREFETCH", fsdp_forward_prefetch=True), {}),  # FSDP2: no such knobs
    (dict(fsdp_transformer_layer_cls_to_wrap=["A", " B"]), dict(fsdp_transformer_layer_cls_to_wrap=["A", "B"])),
    (dict(cpu_ram_efficient_loading="true"), dict(fsdp_cpu_ram_efficient_loading=True)),
])
def test_fsdp_normalisation(given, expected):
    out = normalise_fsdp(given)
    assert {k: out[k] for k in expected} == expected


@pytest.mark.parametrize("given, message", [
    (dict(fsdp_version="3"), "fsdp_version: '3' is not 1 or 2"),
    (dict(fsdp_version=1, fsdp_cpu_ram_efficient_loading="true"), "rank-0 loading is implemented with fsdp_version=2"),
    (dict(fsdp_cpu_ram_efficient_loading="maybe"), "expected true/false (or 'true'/'false'), got 'maybe'"),
    (dict(fsdp_offload_params=True), "fsdp_offload_params: CPU offload of parameters is not implemented"),
    (dict(fsdp_auto_wrap_policy="SIZE_BASED_WRAP"), "'SIZE_BASED_WRAP' is not implemented"),
    (dict(fsdp_auto_wrap_policy="TRANSFORMER_WRAP"), "is not one of TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP,"
                                                     " NO_WRAP; did you mean 'TRANSFORMER_BASED_WRAP'?"),
    (dict(fsdp_sharding_strategy="NO_SHARD"), "'NO_SHARD' is data parallelism: use distributed_type='DDP'"),
    (dict(fsdp_sharding_strategy="HYBRID_SHARD"), "'HYBRID_SHARD' (sharding within a node"),
    (dict(fsdp_sharding_strategy="FULL_SHARD", fsdp_reshard_after_forward=False), "disagree; give one"),
    (dict(fsdp_state_dict_type="LOCAL_STATE_DICT"), "'LOCAL_STATE_DICT' is not supported"),
    (dict(fsdp_version=1, fsdp_backward_prefetch="BACKWARD_POST"), "only 'BACKWARD_PRE'"),
    (dict(fsdp_version=1, fsdp_forward_prefetch="true"), "forward prefetch is not implemented"),
    (dict(fsdp_version=1, fsdp_use_orig_params="false"), "always uses the original parameters"),
    (dict(fsdp_activation_checkpointing_offload=True), "offloading checkpointed activations is not implemented"),
    (dict(fsdp_ignored_modules="lora"), "fsdp_ignored_modules: not implemented"),
    (dict(fsdp_transformer_cls_to_wrap="A"), "unknown key; did you mean 'fsdp_transformer_layer_cls_to_wrap'?"),
    (dict(version=2, fsdp_version=2), "'version' and 'fsdp_version' are the same key"),
])
def test_fsdp_refusals_are_one_line(given, message):
    with pytest.raises(ConfigError) as info:
        normalise_fsdp(given)
    assert message in str(info.value) and "\n" not in str(info.value) and str(info.value).startswith(
        "launch.fsdp_config"), str(info.value)


def test_fsdp_activation_checkpointing_checkpoints_the_wrap_classes(tmp_path):
    cfg = checked(tmp_path, launch=dict(distributed_type="FSDP", num_processes=2, fsdp_config=dict(
        fsdp_transformer_layer_cls_to_wrap="Block", fsdp_activation_checkpointing="true")))
    assert cfg.train.activation_checkpointing and cfg.train.activation_class_names == ["Block"]


# -------------------------------------------------------------------------------------------------- DeepSpeed
class Train(dict):
    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


def test_deepspeed_plugin_keys_build_the_deepspeed_json():
    train = Train(gradient_accumulation_steps=2, max_grad_norm=None)
    ds = normalise_deepspeed(dict(zero_stage="3", offload_optimizer_device="cpu", offload_param_device="none",
                                  gradient_clipping="1.0", gradient_accumulation_steps=2,
                                  zero3_save_16bit_model="true", zero3_init_flag="false"), train)
    assert ds["zero_optimization"] == dict(stage=3, offload_optimizer=dict(device="cpu"),
                                           stage3_gather_16bit_weights_on_model_save=True)
    assert ds["gradient_clipping"] == "auto" and train.max_grad_norm == 1.0  # one value: the train config's
    assert normalise_deepspeed(dict(zero_stage=2, offload_optimizer_device="nvme", offload_optimizer_nvme_path="/nv"),
                               Train(gradient_accumulation_steps=1, max_grad_norm=None)
                               )["zero_optimization"]["offload_optimizer"] == dict(device="nvme", nvme_path="/nv")
    assert normalise_deepspeed(dict(deepspeed_config_file="zero2.json"), train) == dict(
        deepspeed_config_file="zero2.json")
    inline = dict(zero_optimization=dict(stage=1), bf16=dict(enabled="auto"))
    assert normalise_deepspeed(inline, train) == inline  # our own inline DeepSpeed form is kept
    inline = dict(zero_optimization=dict(stage=2), gradient_clipping=1.0, gradient_accumulation_steps="auto")
    assert normalise_deepspeed(inline, train) == inline  # keys of both forms: DeepSpeed's own keys decide
    assert normalise_deepspeed(dict(gradient_clipping=0.5), Train(gradient_accumulation_steps=1, max_grad_norm=None)
                               )["zero_optimization"] == dict(stage=2)  # Accelerate's form: its default stage
    # zero3_init_flag (rank-0 loading under ZeRO-3) is kept beside either form, and only when true
    assert normalise_deepspeed(dict(zero_stage=3, zero3_init_flag="true"), train)["zero3_init_flag"] is True
    assert normalise_deepspeed(dict(deepspeed_config_file="zero3.json", zero3_init_flag=True), train) == dict(
        deepspeed_config_file="zero3.json", zero3_init_flag=True)
    assert normalise_deepspeed(dict(inline, zero3_init_flag=True), train) == dict(inline, zero3_init_flag=True)


@pytest.mark.parametrize("given, message", [
    (dict(deepspeed_config_file="zero2.json", zero_stage=3), "zero_stage: set it inside deepspeed_config_file"),
    (dict(zero_stage=2, zero_optimization={}), "zero_optimization: unknown key"),
    (dict(zero_stage=5), "zero_stage: 5 is not 0, 1, 2 or 3"),
    (dict(zero_stage=3, zero3_init_flag="maybe"), "zero3_init_flag: expected true/false"),
    (dict(zero_stage=2, offload_optimizer_device="disk"), "'disk' is not one of NONE, CPU, NVME"),
    (dict(zero_stage=2, offload_param_device="nvme"), "offload_param_nvme_path: offload to nvme needs a folder"),
    (dict(zero_stage=2, gradient_clipping=0.5), "gradient_clipping=0.5 disagrees with train.max_grad_norm=1.0"),
    (dict(zero_stage=2, gradient_accumulation_steps=4), "gradient_accumulation_steps=4 disagrees with"),
    (dict(zero_stage=2, deepspeed_hostfile="/h"), "deepspeed_hostfile: giga-train does not start machines"),
    (dict(zero_stage=2, deepspeed_moe_layer_cls_names="Moe"), "MoE leaf modules are not implemented"),
])
def test_deepspeed_refusals(given, message):
    with pytest.raises(ConfigError) as info:
        normalise_deepspeed(given, Train(gradient_accumulation_steps=1, max_grad_norm=1.0))
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_deepspeed_config_resolves_with_the_plugin_keys(tmp_path):
    pytest.importorskip("deepspeed")
    cfg = checked(tmp_path, launch=dict(distributed_type="DEEPSPEED", num_processes=2,
                                        deepspeed_config=dict(zero_stage=1, gradient_clipping=1.0)))
    assert cfg.train.max_grad_norm == 1.0 and cfg.launch.deepspeed_config.zero_optimization.stage == 1


def test_check_cli_on_a_gigatrain_style_config(tmp_path, capsys):
    cfg = tiny_config(tmp_path / "run", max_epochs=0, checkpoint_total_limit=-1, checkpoint_interval=5,
                      mixed_precision=None, log_with=["tensorboard"], my_option=3)
    cfg["launch"] = dict(distributed_type="NO", until_completion=True)
    cfg["test"] = dict()
    cfg["dataloaders"]["test"] = dict()
    path = tmp_path / "c.py"
    path.write_text(f"config = {cfg!r}\n")
    assert main(["check", str(path)]) == 0, capsys.readouterr().err


def test_validation_is_idempotent(tmp_path, monkeypatch):
    """Each rank validates the launcher's already-normalised config again: the second pass changes nothing."""
    import copy
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    cfg = checked(tmp_path, launch=dict(gpu_ids=[[0, 1], [2, 3]], main_process_ip=["a", "b"], distributed_type="fsdp",
                                        fsdp_config=dict(version="2", sharding_strategy="SHARD_GRAD_OP",
                                                         transformer_layer_cls_to_wrap="Block",
                                                         activation_checkpointing="true"),
                                        dynamo_config=dict(dynamo_backend="INDUCTOR"), enable_cpu_affinity=False),
                  max_steps=0, max_epochs=2, checkpoint_interval=0.25, checkpoint_total_limit=-1, log_with=None,
                  mixed_precision=None, loss_nan_total_limit=-1, grad_norm_type="inf", extra_knob=1)
    first = copy.deepcopy(cfg)
    validated_runners(cfg)
    assert cfg == first
    assert cfg.launch.fsdp_config.fsdp_reshard_after_forward is False and cfg.train.max_nan_steps is None
