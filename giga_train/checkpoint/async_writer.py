"""train.checkpoint_async: the loop takes a checkpoint's state into host memory and goes on; a thread
writes the files and commits the folder.

The loop pays for Checkpointer.parts' `take`s: the collectives and device->host copies. The
thread runs the `write`s, then every rank's thread tells the others how its writing went (an
all_gather on a gloo group of the checkpoints' own, as are DCP's collectives in write_state: they
never run beside the training thread's collectives on the default group), and the main rank commits
(meta.json, rename, rolling limit) only when every rank's files are complete; otherwise it removes the
folder. At most one save is in flight: the next save, a resume and the end of train() `wait` for it,
and its error surfaces there, on the training thread, the same on every rank."""
import logging
import os
import shutil
import threading
import time

import torch.distributed as dist

from .manager import disk_error

log = logging.getLogger("giga_train")


class AsyncWriter:
    def __init__(self, checkpointer):
        self.checkpointer = checkpointer
        self.rank, self.is_main = checkpointer.env.rank, checkpointer.env.is_main
        # A collective: every rank creates it here, at start-up, on the training thread.
        self.group = dist.new_group(backend="gloo", timeout=checkpointer.env.timeout) if dist.is_initialized() else None
        self._thread = self._outcome = None

    @property
    def in_flight(self):
        return self._thread is not None and self._thread.is_alive()

    def save(self, tmp, parts, meta, start):
        """Take the state (training thread), then write `parts` into `tmp` and commit in the background."""
        self.wait()
        taken = [(write, take()) for take, write in parts]
        step = meta["step"]
        # Not a daemon: an interpreter that exits without waiting still finishes the write first.
        self._thread = threading.Thread(target=self._write, args=(tmp, taken, meta, step, start),
                                        name=f"giga-train-checkpoint-{step}")
        self._thread.start()

    def wait(self, raise_errors=True):
        """Block until the save in flight (if any) is complete; raise its error here."""
        if self._thread is None:
            return
        self._thread.join()
        outcome, self._thread, self._outcome = self._outcome, None, None
        if outcome["failures"] and raise_errors:
            raise self._error(outcome)
        if outcome["failures"]:  # another error is on its way out: say this one, do not hide that
            log.error("%s", self._error(outcome))

    # -- the background thread ------------------------------------------------------------------
    def _write(self, tmp, taken, meta, step, start):
        checkpointer, error = self.checkpointer, None
        try:
            written = time.perf_counter()
            while taken:
                write, state = taken.pop(0)  # frees each host copy once written
                try:
                    write(state)
                except BaseException as e:  # still run the other writes: write_state is a collective
                    error = error or e
            failures = self._gather(error)
            if not failures and self.is_main:
                try:
                    final = checkpointer.commit(tmp, meta)
                    log.info("saved %s (%.2f s in the loop, %.1f s written in the background)", final,
                             written - start, time.perf_counter() - written)
                except Exception as e:
                    error = e
            if not failures:
                failures = self._gather(error)  # the commit's outcome, for every rank
            if failures and self.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException as e:  # e.g. a peer died in the gather: the training thread hears of it
            error = error or e
            failures = [_summary(error, self.rank)]
        self._outcome = dict(step=step, tmp=tmp, error=error, failures=failures)

    def _gather(self, error):
        """Every rank's failure (rank, what, errno, filename), those without one left out."""
        summary = _summary(error, self.rank) if error is not None else None
        everyone = [summary]
        if self.group is not None and dist.get_world_size(self.group) > 1:
            everyone = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(everyone, summary, group=self.group)
        return [s for s in everyone if s is not None]

    def _error(self, outcome):
        step, failures = outcome["step"], outcome["failures"]
        for f in failures:
            if f["errno"] is not None:  # a full disk anywhere: the checkpointer's one line, on every rank
                disk = OSError(f["errno"], os.strerror(f["errno"]), f["filename"])
                return self.checkpointer.stopped_by_full_disk(step, outcome["tmp"], disk)
        first, own = failures[0], outcome["error"]
        where = "" if first["rank"] == self.rank else f" on rank {first['rank']}"
        error = RuntimeError(f"checkpoint at step {step}: writing it in the background failed{where}: "
                             f"{first['what']}; the newest complete checkpoint is"
                             f" {self.checkpointer.latest() or 'none yet'}")
        error.__cause__ = own if own is not None and not where else None
        return error


def _summary(error, rank):
    disk = disk_error(error)
    text = str(error).strip().splitlines()
    return dict(rank=rank, what=f"{type(error).__name__}: {text[0] if text else ''}",
                errno=disk.errno if disk is not None else None,
                filename=disk.filename if disk is not None else None)
