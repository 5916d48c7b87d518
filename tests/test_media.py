"""log_image / log_video / log_figure read back from every tracker (TensorBoard's event file, an offline
wandb run, the JSONL run's files), rank-0-only calls that do not hang at 2 ranks, the public ema_weights
context, the sample_step hook's media at validation, and a Tester's media (test-only run)."""
import glob
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from giga_train import launch_from_config
from giga_train.trainers.validation import ema_weights
from tests import gigatrain_client
from tests.test_trackers import wandb_records
from tests.tiny import TinyTrainer
from tests.tiny_eval import eval_job

COLOURS = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]])
CLIP = COLOURS[:, :, None, None].expand(4, 3, 6, 5)  # T,C,H,W float: one solid colour a frame (exact in a GIF)
PICTURE = torch.arange(3 * 4 * 5, dtype=torch.float32).reshape(3, 4, 5) / 60  # CHW float in [0, 1)
PICTURE_HWC = (PICTURE.permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)


class PngFigure:
    """What log_figure uses of a matplotlib figure (matplotlib is not installed here): savefig to PNG."""

    def savefig(self, file, format):
        Image.fromarray(PICTURE_HWC[::-1].copy()).save(file, format=format.upper())


class MediaTrainer(TinyTrainer):
    """At step 2: an image in each accepted form and two videos, rank 0 only ('only_main') and on every
    rank ('every'); sample_step: a clip and a still from the model's own output, at every validation."""

    def forward_step(self, batch_dict):
        if self.cur_step == 2 and self.model.training:  # not in validation_step (forward_step by default)
            if self.rank == 0:
                self.log_image("only_main/chw_float", PICTURE)
                self.log_image("only_main/pil", Image.fromarray(PICTURE_HWC))
                self.log_figure("only_main/figure", PngFigure())
                self.log_video("only_main/clip", CLIP, fps=4)
            self.log_image("every/hwc_uint8", PICTURE_HWC)
            self.log_video("every/thwc_uint8", (CLIP.permute(0, 2, 3, 1).numpy() * 255).astype(np.uint8), fps=4)
        return super().forward_step(batch_dict)

    def sample_step(self, batch_dict):
        self.sample_calls = getattr(self, "sample_calls", 0) + 1
        assert not torch.is_grad_enabled() and not self.model.training
        logits = self.model(batch_dict["tokens"])  # every rank runs the forward (a sharded engine needs it)
        still = logits[0, :, :12].sigmoid()[None].expand(3, -1, -1)  # 3 x 16 x 12 in [0, 1]
        return {"still": still, "clip": CLIP}


def decoded(data):
    image = Image.open(io.BytesIO(data))
    frames = []
    for i in range(getattr(image, "n_frames", 1)):
        image.seek(i)
        frames.append(np.asarray(image.convert("RGB")))
    return np.stack(frames)


CLIP_UINT8 = (CLIP.permute(0, 2, 3, 1).numpy() * 255 + 0.5).astype(np.uint8)
EXPECTED = {"only_main/chw_float": PICTURE_HWC[None], "only_main/pil": PICTURE_HWC[None],
            "only_main/figure": PICTURE_HWC[None, ::-1], "every/hwc_uint8": PICTURE_HWC[None],
            "only_main/clip": CLIP_UINT8, "every/thwc_uint8": CLIP_UINT8, "samples/clip": CLIP_UINT8}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    project = tmp_path_factory.mktemp("media")
    env = dict(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_CONFIG_DIR=str(project / "wandb_config"),
               WANDB_CACHE_DIR=str(project / "wandb_cache"), WANDB_DATA_DIR=str(project / "wandb_data"))
    cfg = eval_job(project, runner="tests.test_media.MediaTrainer", log_with=["tensorboard", "jsonl", "wandb"])
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        trainer = launch_from_config(cfg)
    return project, trainer


def test_tensorboard_holds_the_images_and_the_videos_as_animated_gifs(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    project, _ = run
    events = EventAccumulator(str(project / "logs"), size_guidance={"images": 0})
    events.Reload()
    for name, expected in EXPECTED.items():
        [event] = [e for e in events.Images(name) if e.step == 2] if not name.startswith("samples") else \
            events.Images(name)[:1]
        np.testing.assert_array_equal(decoded(event.encoded_image_string), expected, err_msg=name)
    assert [e.step for e in events.Images("samples/still")] == [2, 4]  # eval_interval=2 of 4 steps
    assert events.Images("samples/still")[0].width == 12 and events.Images("samples/still")[0].height == 16


def test_the_jsonl_run_writes_files_under_media_named_in_its_lines(run):
    project, _ = run
    lines = [json.loads(line) for line in (project / "logs" / "metrics.jsonl").read_text().splitlines()]
    media = {(k, line["step"]): v for line in lines for k, v in line.items() if isinstance(v, dict) and "path" in v}
    for name, expected in EXPECTED.items():
        entry = media[(name, 2)]
        assert entry["type"] == ("video" if expected.shape[0] > 1 else "image") and entry["path"].startswith("media/")
        np.testing.assert_array_equal(decoded((project / "logs" / entry["path"]).read_bytes()), expected, err_msg=name)
    assert media[("only_main/clip", 2)]["fps"] == 4
    assert sum(1 for k, _ in media if k == "every/hwc_uint8") == 1 and ("samples/still", 4) in media


def test_the_offline_wandb_run_has_the_images_and_videos(run):
    project, _ = run
    [run_dir] = glob.glob(str(project / "logs" / "wandb" / "offline-run-*"))
    [run_file] = glob.glob(run_dir + "/run-*.wandb")
    seen = {}
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:  # a media value comes as one item per field: nested_key [name, field]
                if len(item.nested_key) == 2:
                    entry = seen.setdefault((item.nested_key[0], record.history.step.num), {})
                    entry[item.nested_key[1]] = json.loads(item.value_json)
    for name, expected in EXPECTED.items():
        value = seen[(name, 2)]
        assert value["_type"] == ("video-file" if expected.shape[0] > 1 else "image-file"), name
        data = open(f"{run_dir}/files/{value['path']}", "rb").read()
        np.testing.assert_array_equal(decoded(data), expected, err_msg=name)


def test_sample_step_runs_at_each_validation_and_leaves_training_as_it_was(run):
    _, trainer = run
    assert trainer.sample_calls == 2 and trainer.model.training


def test_rank0_only_media_at_two_fsdp2_ranks_do_not_hang_and_every_rank_calls_write_once(tmp_path):
    """FSDP2 gathers the weights in each forward: sample_step's forward runs on both ranks, on the EMA weights."""
    cfg = eval_job(tmp_path, "FSDP", ranks=2, runner="tests.test_media.MediaTrainer", log_with="jsonl",
                   launch=dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block")),
                   with_ema=True, eval_ema=True)
    launch_from_config(cfg)
    lines = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    names = [k for line in lines for k, v in line.items() if isinstance(v, dict) and "path" in v]
    assert sorted(names) == sorted(list(EXPECTED) + ["samples/still", "samples/clip", "samples/still"])
    assert len(glob.glob(str(tmp_path / "logs" / "media" / "*"))) == len(names)


def test_ema_weights_swaps_the_average_in_and_the_trained_weights_back(tmp_path):
    trainer = launch_from_config(eval_job(tmp_path, runner="tests.tiny.TinyTrainer", with_ema=True, ema_decay=0.5,
                                          eval_interval=None))
    trained = {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters()}
    with trainer.ema_weights():
        inside = [p.detach().clone() for p in trainer.ema.params]
    for got, shadow in zip(inside, trainer.ema.shadow):
        torch.testing.assert_close(got, shadow.to(got.dtype), rtol=0, atol=0)
    assert any(not torch.equal(a, b) for a, b in zip(inside, trained.values()))  # the average is not the weights
    for name, param in trainer.unwrapped_model.named_parameters():
        assert torch.equal(param, trained[name]), name  # bit for bit after the context
    with ema_weights(None):  # without EMA: nothing changes
        pass



def test_the_accepted_forms_give_the_same_pixels_and_a_bad_shape_one_line():
    from giga_train.tracking.media import as_image, as_video
    for form in (PICTURE, PICTURE.permute(1, 2, 0), PICTURE.numpy(), PICTURE_HWC, Image.fromarray(PICTURE_HWC),
                 torch.from_numpy(PICTURE_HWC).permute(2, 0, 1)):
        np.testing.assert_array_equal(as_image(form), PICTURE_HWC)
    assert as_image(torch.zeros(4, 5)).shape == (4, 5, 1)  # grey
    np.testing.assert_array_equal(as_video(CLIP), as_video(CLIP.permute(0, 2, 3, 1)))
    np.testing.assert_array_equal(as_video(list(CLIP)), CLIP_UINT8)
    with pytest.raises(ValueError, match=r"log_image: no channel dimension of 1, 3 or 4 in shape \(5, 6, 7\)"):
        as_image(torch.zeros(5, 6, 7))
    with pytest.raises(ValueError, match=r"log_video: expected frames of 4 dimensions"):
        as_video(torch.zeros(3, 4, 5))
    with pytest.raises(ValueError, match=r"\(4, 3, 5, 6\) \(a batch of images: log each, or side by side"):
        as_image(torch.zeros(4, 3, 5, 6))


def test_a_minus_one_to_one_image_is_said_once(caplog):
    """A diffusion model's [-1, 1] output: clipped to [0, 1] as any float image, with one warning a name."""
    from giga_train.tracking.media import as_image
    for _ in range(2):
        clipped = as_image(PICTURE * 2 - 1, "log_image('denoised')")
    np.testing.assert_array_equal(clipped, as_image((PICTURE * 2 - 1).clamp(min=0)))
    said = [r.getMessage() for r in caplog.records if "denoised" in r.getMessage()]
    assert said == ["log_image('denoised'): float pixels from -1 to 0.967 are clipped to [0, 1] (a [-1, 1] image:"
                    " pass (x + 1) / 2)"]


def test_a_tracker_failing_on_media_is_turned_off_with_one_line():
    import logging
    from giga_train.tracking.base import Tracker
    from giga_train.tracking.guarded import GuardedTracker

    class FullDisk(Tracker):
        def log_media(self, step, name, kind, data, fps=None):
            raise OSError("No space left on device")
    class Lines(logging.Handler):
        lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())
    guarded, handler, logger = GuardedTracker("jsonl", FullDisk), Lines(), logging.getLogger("giga_train")
    logger.addHandler(handler)
    try:
        guarded.log_media(3, "val/x", "image", PICTURE_HWC)
        guarded.log_media(4, "val/x", "image", PICTURE_HWC)
    finally:
        logger.removeHandler(handler)
    assert not guarded.on and len(Lines.lines) == 1
    assert "failed logging image 'val/x' at step 3 (OSError: No space left on device)" in Lines.lines[0]


class MediaTester(gigatrain_client.IndexTester):
    """A test-only run that logs an image at each batch (its step: cur_step) and a clip at the end."""

    def test(self):
        for self._cur_step, batch in enumerate(self.dataloader, 1):
            self.log_image("test/picture", PICTURE * (batch["index"][0] + 1) / 3)
        self.log_video("test/clip", CLIP, fps=4)


def test_a_testers_media_reach_its_trackers_in_logs_test(tmp_path):
    """Tester-only config: test.log_with's TensorBoard event file and JSONL run under logs/test, read back."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cfg = dict(runners=["tests.test_media.MediaTester"], project_dir=str(tmp_path), models=dict(dim=4),
               dataloaders=dict(test=dict(data_or_config=dict(_class_name="CountingDataset", size=5),
                                          batch_size_per_gpu=2)), test=dict(log_with=["tensorboard", "jsonl"]))
    launch_from_config(cfg)
    events = EventAccumulator(str(tmp_path / "logs" / "test"), size_guidance={"images": 0})
    events.Reload()
    pictures = events.Images("test/picture")
    assert [e.step for e in pictures] == [1, 2, 3]  # batches [0, 1], [2, 3], [4]
    for event, first in zip(pictures, (0, 2, 4)):
        expected = ((PICTURE * (first + 1) / 3).clamp(0, 1).permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)
        np.testing.assert_array_equal(decoded(event.encoded_image_string)[0], expected)
    [clip] = events.Images("test/clip")
    np.testing.assert_array_equal(decoded(clip.encoded_image_string), CLIP_UINT8)
    lines = [json.loads(line) for line in (tmp_path / "logs" / "test" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "test/picture" in line] == [1, 2, 3]
    assert not glob.glob(str(tmp_path / "logs" / "events*"))  # the training's folder: nothing of the Tester's
