"""FSDP2 at 2 ranks (gloo) equal one process with the same global batch; resume; FSDP1 (CUDA only) refused on CPU."""
import os
import shutil

import pytest

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints
from tests.distributed import assert_same_weights, final_weights, job, reference, shared_run

CACHE = {}
FSDP = {2: dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block")),
        1: dict(fsdp_config=dict(fsdp_version=1, fsdp_transformer_layer_cls_to_wrap=["Block"]))}
VARIANT = dict(gradient_accumulation_steps=2, activation_checkpointing=True, activation_class_names=["Block"])


def fsdp_run(tmp_path_factory, version, **train):
    """The 4-step run at 2 ranks of this FSDP version (once per session: the resume test here and
    tests/test_cross_resume.py start from its step 2)."""
    return shared_run(tmp_path_factory, "FSDP", 2, FSDP[version], **train)


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("train", [{}, VARIANT], ids=["plain", "accum2_ckpt"])
def test_fsdp_equals_one_process(tmp_path_factory, version, train):
    project, result = fsdp_run(tmp_path_factory, version, **train)
    assert result["step"] == 4
    assert_same_weights(final_weights(project), reference(tmp_path_factory, CACHE, **train))
    assert os.path.isdir(os.path.join(result["checkpoint"], "optimizer_dcp"))


@pytest.mark.parametrize("version", [2, 1])
def test_fsdp_resume_is_exact(tmp_path, tmp_path_factory, version):
    """The plain run's step-2 checkpoint (a run stopped there wrote the same one), resumed to step 4."""
    source, _ = fsdp_run(tmp_path_factory, version)
    step, path = list_checkpoints(os.path.join(source, "models"))[0]
    assert step == 2
    shutil.copytree(path, tmp_path / "models" / os.path.basename(path))
    launch_from_config(job(tmp_path, "FSDP", ranks=2, launch=FSDP[version], resume=True))
    assert [s for s, _ in list_checkpoints(os.path.join(tmp_path, "models"))] == [2, 4]
    assert_same_weights(final_weights(tmp_path), reference(tmp_path_factory, CACHE))
    assert "resumed from" in (tmp_path / "logs" / "train.log").read_text()


def test_unknown_wrap_class_is_named(tmp_path):
    launch = dict(fsdp_config=dict(fsdp_transformer_layer_cls_to_wrap="Blok"))
    with pytest.raises(Exception, match="no module of class 'Blok' in the model .classes present: Block"):
        launch_from_config(job(tmp_path, "FSDP", ranks=2, launch=launch))
