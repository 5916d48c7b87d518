"""log_image, log_video and log_figure of a Trainer or a Tester: the main rank writes to the runner's trackers
(a Trainer's run log inside train(), a Tester's own: tester_log.py); other ranks return at once (no collective):
a call on every rank writes once, a call on the main rank only does not wait for the others."""
import logging

from ..tracking.media import as_image, as_video

log = logging.getLogger("giga_train")
SAMPLE_FPS = 8  # of a video sample_step returns (log_video inside sample_step for another rate)


def log_media(trainer, kind, name, data, fps=None, step=None):
    """`kind` 'image' or 'video'; at `step` (None: cur_step, the step being computed or the last done), main rank only."""
    if not isinstance(name, str):
        raise TypeError(f"log_{kind}: the name must be a string, got {name!r}")
    if not trainer.is_main_process:
        return
    run_log = getattr(trainer, "run_log", None)
    if run_log is None:
        if not getattr(trainer, "_media_warned", False):
            log.warning("log_%s(%r): no trackers outside train(); nothing logged", kind, name)
            trainer._media_warned = True
        return
    array = as_image(data, f"log_{kind}({name!r})") if kind == "image" else as_video(data, f"log_video({name!r})")
    run_log.metrics.log_media(trainer.cur_step if step is None else step, name, kind, array, fps or SAMPLE_FPS)
