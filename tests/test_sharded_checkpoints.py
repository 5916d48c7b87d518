"""launch.fsdp_config.fsdp_state_dict_type: FULL_STATE_DICT gathers the whole model into the model folders at
each checkpoint; SHARDED_STATE_DICT has each rank write only its own shards (model_dcp/) and nothing gathered.
Both must resume to the same bits (2 gloo ranks, and at 1 rank from the 2-rank checkpoint) and convert/export
to the same weights."""
import glob
import json
import math
import os
import shutil
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from torch.distributed.tensor import DTensor

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints, read_meta, read_weights
from giga_train.tools.convert import convert
from giga_train.checkpoint.formats.model_layout import write_shards
from giga_train.checkpoint.manager import weights_finite
from giga_train.checkpoint.formats.full_state import read_dcp_whole
from giga_train.checkpoint.safe_unpickle import load_metadata
from giga_train.errors import ConfigError
from giga_train.tools.convert import read_live_weights as export_weights
from giga_train.trainers.runner import Runner
from tests.distributed import job
from tests.tiny import TinyTrainer

FSDP = {2: dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block"),
        1: dict(fsdp_version=1, fsdp_transformer_layer_cls_to_wrap=["Block"])}
RUNNER = "tests.test_sharded_checkpoints.GatherCountingTrainer"


class GatherCountingTrainer(TinyTrainer):
    """Counts, on each rank, what gathers the whole model while a checkpoint is saved (the strategy's
    model_state_dict and full_state_dict, DTensor.full_tensor), into PROJECT/gathers_<rank>.json."""

    def save_checkpoint(self):
        calls = []

        def counted(owner, name):
            original = getattr(owner, name)

            def counting(*args, **kwargs):
                calls.append(name)
                return original(*args, **kwargs)
            return mock.patch.object(owner, name, counting)
        strategy = type(self.strategy)
        with counted(strategy, "model_state_dict"), counted(strategy, "full_state_dict"), \
                counted(DTensor, "full_tensor"):
            super().save_checkpoint()
        path = os.path.join(self.config.project_dir, f"gathers_{self.env.rank}.json")
        saved = json.load(open(path)) if os.path.exists(path) else []
        json.dump(saved + [len(calls)], open(path, "w"))


def run(project, kind, ranks=2, version=2, strategy="FSDP", **train):
    launch = dict(fsdp_config=dict(FSDP[version], fsdp_state_dict_type=kind)) if strategy == "FSDP" else None
    cfg = job(project, strategy, ranks=ranks, launch=launch, resume=True, **train)
    cfg["runners"] = [RUNNER]
    return launch_from_config(cfg)


def checkpoints(project):
    return dict(list_checkpoints(os.path.join(str(project), "models")))


def gathers(project):
    return {os.path.basename(p): json.load(open(p)) for p in sorted(glob.glob(os.path.join(str(project), "gathers_*")))}


def assert_equal(got, expected):
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), key


_RUNS = {}


def full_and_sharded(tmp_path_factory, version):
    """FULL: 4 steps at once; SHARDED: 2 steps, then resumed to 4 (checkpoints at steps 2 and 4); with EMA
    under FSDP2 (FSDP1 refuses it). Run once per module."""
    if version not in _RUNS:
        root, ema = tmp_path_factory.mktemp(f"fsdp{version}"), version == 2
        full, sharded = root / "full", root / "sharded"
        run(full, "FULL_STATE_DICT", version=version, with_ema=ema)
        # written in the background (checkpoint_async): the shards are host copies taken in the loop
        run(sharded, "SHARDED_STATE_DICT", version=version, max_steps=2, with_ema=ema, checkpoint_async=True)
        run(sharded, "SHARDED_STATE_DICT", version=version, with_ema=ema, checkpoint_async=True)
        assert "resumed from" in (sharded / "logs" / "train.log").read_text()
        _RUNS[version] = full, sharded
    return _RUNS[version]


@pytest.mark.parametrize("version", [2, 1])
def test_sharded_checkpoints_resume_exactly_and_gather_nothing(tmp_path_factory, version):
    full, sharded = full_and_sharded(tmp_path_factory, version)
    assert sorted(checkpoints(full)) == sorted(checkpoints(sharded)) == [2, 4]
    for step in (2, 4):
        assert_equal(read_weights(checkpoints(sharded)[step]), read_weights(checkpoints(full)[step]))
        if version == 2:  # the moving average too, resumed from its shards
            assert_equal(read_weights(checkpoints(sharded)[step], ema=True),
                         read_weights(checkpoints(full)[step], ema=True))
    # FULL gathers at every checkpoint (on every rank: the collective), SHARDED never
    assert all(all(n > 0 for n in counts) for counts in gathers(full).values()) and len(gathers(full)) == 2
    assert gathers(sharded) == {"gathers_0.json": [0, 0], "gathers_1.json": [0, 0]}  # steps 2 and 4
    assert all(read_meta(path)["finite"] is True for path in checkpoints(sharded).values())  # for rotation
    # GigaTrain's load_checkpoint('<checkpoint>/model') names the way to the weights in one line
    with pytest.raises(ConfigError, match=r"no such folder \(.* holds the model as each rank's shards.*convert"):
        Runner.get_checkpoint(SimpleNamespace(_checkpoint_path=str), os.path.join(checkpoints(sharded)[4], "model"))
    # and no whole-model file: one shard file per rank, each holding about half of the model's bytes
    folder = checkpoints(sharded)[4]
    assert not glob.glob(os.path.join(folder, "**", "*.safetensors"), recursive=True)
    assert glob.glob(os.path.join(checkpoints(full)[4], "**", "*.safetensors"), recursive=True)
    model_bytes = sum(v.numel() * v.element_size() for v in read_weights(folder).values())
    per_file = payload_per_file(os.path.join(folder, "model_dcp"))
    assert sorted(per_file) == ["__0_0.distcp", "__1_0.distcp"] and sum(per_file.values()) == model_bytes
    assert all(n < 0.6 * model_bytes for n in per_file.values()), (model_bytes, per_file)


def payload_per_file(folder):
    """{file: bytes of tensor data in it} from a DCP folder's metadata (each chunk's size, not pickling)."""
    meta = load_metadata(os.path.join(folder, ".metadata"))
    found = {}
    for index, stored in meta.storage_data.items():
        tensor = meta.state_dict_metadata[index.fqn]
        chunk = next(c for c in tensor.chunks if tuple(c.offsets) == tuple(index.offset))
        size = math.prod(chunk.sizes) * tensor.properties.dtype.itemsize
        found[stored.relative_path] = found.get(stored.relative_path, 0) + size
    return found


def test_sharded_checkpoint_resumes_at_another_world_size_and_converts(tmp_path, tmp_path_factory):
    full, sharded = full_and_sharded(tmp_path_factory, 2)
    # the step-2 checkpoints resumed at 1 rank land on the same bits: under FSDP (DCP reshards the 2-rank
    # shards into the 1-rank ones) and under one process (the shards read whole)
    for strategy in ("FSDP", "NO"):
        finals = {}
        for name, source in (("full", full), ("sharded", sharded)):
            target = tmp_path / f"{name}_{strategy}"
            path = checkpoints(source)[2]
            shutil.copytree(path, target / "models" / os.path.basename(path))
            run(target, "FULL_STATE_DICT", ranks=1, strategy=strategy, with_ema=True)
            assert "resumed from" in (target / "logs" / "train.log").read_text()
            final = checkpoints(target)[4]
            finals[name] = {**read_weights(final), **{"ema." + k: v for k, v in read_weights(final, ema=True).items()}}
        assert_equal(finals["sharded"], finals["full"])
    # export and convert read the shards whole: the same weights and optimizer state as from FULL
    assert_equal(export_weights(checkpoints(sharded)[4]), export_weights(checkpoints(full)[4]))
    converted = {}
    for name, source in (("full", full), ("sharded", sharded)):
        converted[name] = convert(checkpoints(source)[4], "full", out=str(tmp_path / f"{name}_converted"))
    from safetensors.torch import load_file
    assert_equal(load_file(os.path.join(converted["sharded"], "model.safetensors")),
                 load_file(os.path.join(converted["full"], "model.safetensors")))


def test_export_of_a_sharded_checkpoint_equals_the_full_ones(tmp_path):
    """`giga-train export --to hf` of a transformers model trained 2 steps under FSDP2 at 2 ranks."""
    transformers = pytest.importorskip("transformers")
    from giga_train.cli import main
    from tests.test_export import LLAMA
    exported = {}
    for kind in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        project = tmp_path / kind
        launch = dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="LlamaDecoderLayer",
                                       fsdp_state_dict_type=kind))
        cfg = job(project, "FSDP", ranks=2, launch=launch, max_steps=2, checkpoint_interval=2)
        cfg["runners"], cfg["models"] = ["tests.test_export.LlamaTrainer"], dict(LLAMA)
        launch_from_config(cfg)
        out = str(tmp_path / f"{kind}_hf")
        assert main(["export", checkpoints(project)[2], "--to", "hf", "--out", out]) == 0
        exported[kind] = transformers.LlamaForCausalLM.from_pretrained(out).state_dict()
    assert not glob.glob(os.path.join(checkpoints(tmp_path / "SHARDED_STATE_DICT")[2], "model"))
    assert_equal(exported["SHARDED_STATE_DICT"], exported["FULL_STATE_DICT"])
    assert_equal(exported["SHARDED_STATE_DICT"], read_weights(checkpoints(tmp_path / "FULL_STATE_DICT")[2]))


def test_shards_record_whether_they_were_finite(tmp_path):
    """Rotation keeps the newest checkpoint whose weights were finite: a folder of shards says so."""
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    weights = {"w": torch.arange(6.0).reshape(2, 3), "steps": torch.tensor(3)}
    write_shards(good, weights)
    write_shards(bad, {"w": torch.tensor([1.0, float("nan")])})
    assert weights_finite([good]) is True and weights_finite([bad]) is False
    assert_equal(read_dcp_whole(good, "model"), weights)
