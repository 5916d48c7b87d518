"""log_with's trackers read back: the JSONL file, TensorBoard's event file and a wandb offline run hold the
same scalars as the losses the run computed, and the resolved config once."""
import glob
import importlib.util
import json
import os
import struct

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from giga_train import launch_from_config, load_config
from giga_train.errors import ConfigError
from giga_train.schema import validate_config
from giga_train.tracking.jsonl import JsonlTracker
from tests.distributed import job
from tests.tiny import tiny_config

STEPS, INTERVAL = 8, 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run writing to all three trackers (wandb offline, its files under tmp)."""
    project = tmp_path_factory.mktemp("trackers")
    env = dict(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_CONFIG_DIR=str(project / "wandb_config"),
               WANDB_CACHE_DIR=str(project / "wandb_cache"), WANDB_DATA_DIR=str(project / "wandb_data"))
    cfg = tiny_config(project, max_steps=STEPS, log_interval=INTERVAL, seed=5, count_flops=True,
                      log_with=["tensorboard", "jsonl", "wandb"])
    cfg["models"]["dropout"] = 0.0  # as tests.distributed.job's (dropout changes CPU attention's kernel)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        trainer = launch_from_config(cfg)
    means = [sum(trainer.losses[i:i + INTERVAL]) / INTERVAL for i in range(0, STEPS, INTERVAL)]
    return project, means


def test_jsonl_holds_the_config_once_then_each_log_step(run):
    project, means = run
    lines = [json.loads(line) for line in (project / "logs" / "metrics.jsonl").read_text().splitlines()]
    first, rows = lines[0], lines[1:]
    assert first["step"] == 0 and first["config"]["train"]["max_steps"] == STEPS
    assert first["hparams"]["train.log_interval"] == INTERVAL and first["hparams"]["optimizers.lr"] == 3e-3
    assert first["hparams"]["batch_size"] == 8 and first["hparams"]["world_size"] == 1
    assert [r["step"] for r in rows] == [4, 8] and not any("config" in r for r in rows)
    assert [r["total_loss"] for r in rows] == pytest.approx(means, rel=1e-6)
    assert all(r["samples_per_sec"] > 0 and r["peak_rss_gb"] > 0 for r in rows)


def test_tensorboard_has_the_scalars_the_config_text_and_hparams(run):
    from tensorboard.plugins.hparams import plugin_data_pb2
    project, means = run
    events = EventAccumulator(str(project / "logs"))
    events.Reload()
    assert [e.value for e in events.Scalars("train/total_loss")] == pytest.approx(means, rel=1e-6)
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads(text.strip("`\n"))["train"]["log_interval"] == INTERVAL
    content = events.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = session.session_start_info.hparams
    assert hparams["train.max_steps"].number_value == STEPS and hparams["launch.distributed_type"].string_value == "NO"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    assert [m.name.tag for m in experiment.experiment.metric_infos] == ["train/total_loss"]


def wandb_records(path):
    """The records of a wandb run file (LevelDB-log framing: 7-byte header, 32 KiB blocks of
    [crc32 4][length 2][type 1][data] chunks; type 1 full, 2-4 first/middle/last), as protobuf Records."""
    from wandb.proto import wandb_internal_pb2
    data, block, pos, pending = open(path, "rb").read(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        pending, pos = pending + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            yield wandb_internal_pb2.Record.FromString(pending)
            pending = b""


def test_wandb_offline_run_has_the_config_and_the_losses(run):
    project, means = run
    [run_file] = glob.glob(str(project / "logs" / "wandb" / "offline-run-*" / "run-*.wandb"))
    config, history = {}, {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            items = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in items})
        elif kind == "history":
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            history[record.history.step.num] = row
    assert config["train"]["max_steps"] == STEPS and config["project_dir"] == str(project)
    assert sorted(history) == [4, 8]
    assert [history[s]["train/total_loss"] for s in (4, 8)] == pytest.approx(means, rel=1e-6)


def flops_per_sample(row, world_size):
    return row["tflops_per_device"] * 1e12 * world_size / row["samples_per_sec"]


def test_only_the_main_rank_writes_the_trackers_and_flops_per_sample_are_those_of_one_process(tmp_path, run):
    result = launch_from_config(job(tmp_path, "DDP", ranks=2, log_with="jsonl", log_interval=2, count_flops=True))
    lines = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 2, 4]  # one writer, not two interleaved
    assert lines[-1]["total_loss"] == pytest.approx(result["metrics"]["total_loss"], rel=1e-6)
    assert lines[0]["hparams"]["world_size"] == 2
    # the same model and sample shape at batch 8 in one process, 4 a rank here: the same FLOPs a sample
    one_process = json.loads((run[0] / "logs" / "metrics.jsonl").read_text().splitlines()[-1])
    assert flops_per_sample(lines[-1], 2) == pytest.approx(flops_per_sample(one_process, 1), rel=1e-9)
    assert flops_per_sample(one_process, 1) > 0


def test_a_resumed_jsonl_drops_what_a_crashed_run_wrote_past_its_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ({"step": 0, "config": {}}, {"step": 4, "loss": 2.0},
                                                          {"step": 8, "loss": 1.5}, {"step": 12, "loss": 1.0}))
                    + '{"step": 1')  # a line cut by the crash
    tracker = JsonlTracker(str(tmp_path), start_step=8, config={"a": 1}, hparams={})
    tracker.log(12, {"loss": 0.5, "inf": float("inf")})
    tracker.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 4, 8, 8, 12]
    assert rows[3]["config"] == {"a": 1} and rows[4] == {"step": 12, "loss": 0.5, "inf": "inf"}
    before = path.read_text()
    JsonlTracker(str(tmp_path), 0, {}, {}).close()  # a run from step 0 starts a file; the last one is kept
    assert path.read_text() == '{"step": 0, "config": {}, "hparams": {}}\n'
    assert (tmp_path / "metrics.1.jsonl").read_text() == before
    JsonlTracker(str(tmp_path), 0, {}, {}).close()
    assert sorted(os.listdir(tmp_path)) == ["metrics.1.jsonl", "metrics.2.jsonl", "metrics.jsonl"]


def test_log_with_names_are_checked(tmp_path, monkeypatch):
    def check(log_with):
        cfg = load_config(tiny_config(tmp_path, log_with=log_with))
        validate_config(cfg)
        return cfg.train.log_with

    assert check(["TensorBoard", "jsonl", "none"]) == ["tensorboard", "jsonl"]
    with pytest.raises(ConfigError, match="train.log_with: 'jsonll' is not supported.*did you mean 'jsonl'"):
        check("jsonll")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    assert check("all") == ["tensorboard", "jsonl"]  # Accelerate's 'all': the trackers that are installed
    with pytest.raises(ConfigError, match=r"'wandb' needs the wandb package: pip install 'giga-train\[wandb\]'"):
        check(["tensorboard", "wandb"])
