"""No code runs from a checkpoint file: a crafted pickle in DCP's `.metadata` or in any of DeepSpeed's
state files is refused with one line naming the file, and what it would have run never runs."""
import json
import os
import re
import shutil

import pytest
import torch

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints
from giga_train.errors import UnsafeCheckpointError
from giga_train.checkpoint.safe_unpickle import load_dcp, load_metadata, safe_torch_loads, torch_load
from giga_train.cli import main
from giga_train.checkpoint.formats import full_state
from tests.tiny import tiny_config


class Evil:
    """Unpickling this creates the marker file: what a crafted checkpoint would do (any code)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def plain_pickle(path, marker):
    import pickle
    with open(path, "wb") as f:
        pickle.dump({"state_dict_metadata": Evil(marker)}, f)


def refused(call, path, marker):
    with pytest.raises(UnsafeCheckpointError) as info:
        call()
    message = str(info.value)
    assert message.count("\n") == 0 and os.path.basename(str(path)) in message, message
    assert re.search(r"names (builtins|io)\.open,", message) and "refused" in message, message
    assert not os.path.exists(marker), "the crafted pickle ran"
    return message


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A real NO checkpoint (model/, optimizer_dcp/, training_state.pt ...) at step 2."""
    project = tmp_path_factory.mktemp("ckpt")
    launch_from_config(tiny_config(project, max_steps=2, checkpoint_interval=2))
    return list_checkpoints(str(project / "models"))[-1][1]


def test_real_dcp_metadata_loads_through_the_allow_list(checkpoint):
    metadata = load_metadata(os.path.join(checkpoint, "optimizer_dcp", ".metadata"))
    assert metadata.state_dict_metadata  # DCP's dataclasses, torch sizes and dtypes: all allowed
    state = full_state.read_dcp(checkpoint)
    assert set(state) == {"state", "param_groups"} and state["state"]


def test_crafted_dcp_metadata_is_refused_at_resume_and_convert(checkpoint, tmp_path, capsys):
    folder = tmp_path / "checkpoint_epoch_1_step_2"
    shutil.copytree(checkpoint, folder)
    metadata, marker = folder / "optimizer_dcp" / ".metadata", str(tmp_path / "pwned")
    plain_pickle(metadata, marker)
    record_checksums(folder)  # as a forger would: checksums guard against accidents, the allow-list against code
    refused(lambda: load_metadata(str(metadata)), metadata, marker)
    refused(lambda: full_state.read_dcp(str(folder)), metadata, marker)  # the cross-strategy resume path

    # what strategies' load_state calls instead of dcp.load(state, checkpoint_id=...)
    refused(lambda: load_dcp({"optimizer": {}}, folder / "optimizer_dcp", no_dist=True), metadata, marker)

    for to in ("full", "dcp"):
        assert main(["convert", str(folder), "--to", to, "--out", str(tmp_path / to)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ".metadata: refused to load" in err and ".open," in err, err
        assert not os.path.exists(marker) and not os.path.exists(tmp_path / to)


def test_garbage_dcp_metadata_is_one_line(tmp_path):
    path = tmp_path / ".metadata"
    path.write_bytes(b"\x80\x04garbage")
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata: not a readable checkpoint metadata file"):
        load_metadata(str(path))


DEEPSPEED_FILES = ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                   "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"]


@pytest.mark.parametrize("name", DEEPSPEED_FILES + ["zero/embed.weight/fp32.pt", "zero/embed.weight/exp_avg.pt"])
def test_crafted_deepspeed_file_is_refused(tmp_path, name):
    """DeepSpeed's state files and the universal pieces: read by torch_load, and inside safe_torch_loads
    (DeepSpeed's own load_checkpoint and converter call torch.load(weights_only=False))."""
    path, marker = tmp_path / name, str(tmp_path / "pwned")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"module": {}, "args": Evil(marker)}, path)
    refused(lambda: torch_load(str(path)), path, marker)

    def as_deepspeed_calls_it():
        with safe_torch_loads():
            torch.load(str(path), map_location="cpu", weights_only=False)
    refused(as_deepspeed_calls_it, path, marker)
    assert torch.load is torch.serialization.load  # restored


def test_crafted_deepspeed_checkpoint_is_refused_by_convert_and_the_fallback_path(checkpoint, tmp_path, capsys):
    """A checkpoint folder that says DeepSpeed wrote it: `convert` and the cross-strategy reader
    (read_deepspeed: ZeRO-0's unpartitioned file; stages 1-3's optimizer files via the converter)."""
    folder = tmp_path / "checkpoint_epoch_1_step_2"
    shutil.copytree(checkpoint, folder)
    state_dir = folder / full_state.DEEPSPEED_DIR / full_state.DEEPSPEED_TAG
    state_dir.mkdir(parents=True)
    full_state.write_deepspeed_meta(str(folder), 0, 1)
    marker = str(tmp_path / "pwned")
    torch.save({"module": {}, "param_shapes": Evil(marker)}, state_dir / "mp_rank_00_model_states.pt")
    assert main(["convert", str(folder), "--to", "full", "--out", str(tmp_path / "full")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mp_rank_00_model_states.pt: refused to load" in err, err
    refused(lambda: full_state.read_deepspeed(str(folder), [("w", (1,))], [dict(params=[0])]),
            "mp_rank_00_model_states.pt", marker)
    torch.save({"optimizer_state_dict": Evil(marker)}, state_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    refused(lambda: full_state.read_deepspeed(str(folder), [("w", (1,))], [dict(params=[0])]),
            "optim_states.pt", marker)
    assert not os.path.exists(marker)


def test_real_deepspeed_classes_are_allowed(tmp_path):
    """What DeepSpeed's files hold beside tensors (seen in ZeRO-0..3 fp32/bf16 files): loads."""
    deepspeed = pytest.importorskip("deepspeed")
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address
    import argparse
    assert deepspeed
    state = {"zero_stage": ZeroStageEnum.gradients, "loss_scaler": LossScaler(1.0),
             "param_slice_mappings": {"w": fragment_address(numel=4, start=0)}, "args": argparse.Namespace(a=1),
             "param_shapes": [{"w": torch.Size([2, 2])}], "tensor": torch.ones(2, dtype=torch.bfloat16)}
    torch.save(state, tmp_path / "f.pt")
    back = torch_load(str(tmp_path / "f.pt"))
    assert back["zero_stage"] == ZeroStageEnum.gradients and back["loss_scaler"].cur_scale == 1.0
    assert back["param_slice_mappings"]["w"].numel == 4 and back["args"].a == 1


def record_checksums(folder):
    """meta.json's recorded checksums rewritten for the folder's files as they are now."""
    from giga_train.checkpoint.checksums import folder_checksums
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"] = folder_checksums(str(folder))
    (folder / "meta.json").write_text(json.dumps(meta))
