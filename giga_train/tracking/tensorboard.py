"""TensorBoard: scalars under train/, the resolved config as text and its hyper-parameters (HParams tab);
images (IMAGES tab) and videos (as animated GIF images, as torch's add_video writes them) under their own tag."""
import json

from .base import Tracker, tag, tag_group
from .guarded import quiet_thread_errors
from .media import gif_bytes


class TensorBoardTracker(Tracker):
    def __init__(self, log_dir, start_step, config, hparams):
        from tensorboard.summary.writer import event_file_writer
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        writer_thread = getattr(event_file_writer, "_AsyncWriterThread", None)
        if writer_thread is not None:  # its error comes back at our next call: one warning there
            quiet_thread_errors(writer_thread)
        # purge_step hides events a crashed run wrote past the step we resume from.
        self.writer = SummaryWriter(log_dir, purge_step=start_step + 1 if start_step else None)
        self.group = tag_group(config)
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")
        # In this run's own event file (add_hparams would open a sub-run): the HParams tab pairs these values
        # with the run's train/total_loss scalars.
        for summary in hparams_summaries(hparams, {tag("total_loss", self.group): 0.0}):
            self.writer.file_writer.add_summary(summary)

    def log(self, step, scalars):
        for name, value in scalars.items():
            self.writer.add_scalar(tag(name, self.group), value, step)

    def log_media(self, step, name, kind, data, fps=None):
        if kind == "image":
            self.writer.add_image(name, data, step, dataformats="HWC")
            return
        # torch's add_video needs moviepy; its summary is a GIF image, which TensorBoard animates: the same here
        from tensorboard.compat.proto.summary_pb2 import Summary
        frames, height, width, channels = data.shape
        image = Summary.Image(height=height, width=width, colorspace=min(channels, 3),
                              encoded_image_string=gif_bytes(data, fps))
        self.writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=name, image=image)]), step)

    def close(self):
        self.writer.flush()
        self.writer.close()
