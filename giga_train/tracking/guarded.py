"""A tracker never stops a run: the first error of a tracker (opening it, logging a step, closing it: a
full disk, a lost connection) turns that tracker off with one warning line, and training, the text log
and checkpointing go on."""
import logging
import threading

from .base import Tracker

log = logging.getLogger("giga_train")


class GuardedTracker(Tracker):
    """`open_tracker()` builds the tracker; None when it failed (warned once)."""

    def __init__(self, name, open_tracker):
        self.name = name
        self.tracker = self._call("opening it", open_tracker)

    @property
    def on(self):
        return self.tracker is not None

    def log(self, step, scalars):
        if self.tracker is not None:
            self._call(f"at step {step}", self.tracker.log, step, scalars)

    def log_media(self, step, name, kind, data, fps=None):
        if self.tracker is not None:
            self._call(f"logging {kind} {name!r} at step {step}", self.tracker.log_media, step, name, kind, data, fps)

    def close(self):
        if self.tracker is not None:
            tracker, self.tracker = self.tracker, None
            self._call("closing it", tracker.close, tracker=tracker)

    def _call(self, when, function, *args, tracker=None):
        try:
            return function(*args)
        except Exception as e:  # anything: a tracker is never worth the run
            self._turn_off(when, e, tracker or self.__dict__.get("tracker"))
            return None

    def _turn_off(self, when, error, tracker):
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        log.warning("tracker '%s' failed %s (%s%s): turned off for the rest of the run; training and checkpoints"
                    " go on", self.name, when, type(error).__name__, f": {message}" if message else "")
        self.tracker = None
        if tracker is not None:
            try:
                tracker.close()  # what can still be released (a file that cannot be flushed is closed anyway)
            except Exception:
                pass


def quiet_thread_errors(thread_class):
    """Errors that kill a `thread_class` thread are not printed as a traceback by threading.excepthook:
    the tracker that owns the thread raises them again on its next call, where GuardedTracker turns it off
    with its one line (TensorBoard's event writer thread does so)."""
    previous = threading.excepthook
    if getattr(previous, "quiet_classes", None) is not None:
        previous.quiet_classes.add(thread_class)
        return

    def hook(args):
        if not isinstance(args.thread, tuple(hook.quiet_classes)):
            previous(args)
    hook.quiet_classes = {thread_class}
    threading.excepthook = hook
