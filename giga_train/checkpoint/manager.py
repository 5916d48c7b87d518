"""Checkpoint folders: atomic writes, the newest complete one, and the rolling limit.

`{project_dir}/models/checkpoint_epoch_{E}_step_{S}/` appears only complete: it is written under a
hidden temporary name and renamed at the end. Deletions rename first too, so a half-deleted folder
never looks like a checkpoint."""
import errno
import json
import logging
import os
import re
import shutil
import time
import uuid

from ..errors import CheckpointError, ConfigError, CorruptCheckpointError

NAME = re.compile(r"^checkpoint_epoch_(\d+)_step_(\d+)$")
SET_ASIDE = re.compile(r"^checkpoint_epoch_\d+_step_\d+\.superseded_\d+$")  # _set_aside's names
META = "meta.json"
TMP_PREFIX = ".tmp_"
TRASH_PREFIX = ".trash_"
FINITE_KEY = "giga_train_finite"  # in save_weights' safetensors metadata: "true" / "false"
log = logging.getLogger("giga_train")


def checkpoint_name(epoch, step):
    return f"checkpoint_epoch_{epoch}_step_{step}"


def is_complete(path):
    """A checkpoint folder's name, and a meta.json that reads as a JSON object (written last)."""
    return NAME.match(os.path.basename(os.path.normpath(path))) is not None and meta_or_none(path) is not None


def list_checkpoints(models_dir):
    """Complete checkpoints as (step, path), oldest step first."""
    return sorted((step, path) for _, step, path, _ in _complete(models_dir))


def read_meta(path):
    with open(os.path.join(path, META)) as f:
        return json.load(f)


def meta_or_none(path):
    """meta.json as a dict, or None when it is missing or not one (garbage, truncated, a list...)."""
    try:
        meta = read_meta(path)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _complete(models_dir):
    """(write order key, step, path, meta) of each complete checkpoint, in write order (oldest first).
    The order is the folder's own count of commits, meta.json's `seq` (1 + the highest in the folder when
    it was committed; the project lock keeps one writer), then the step: never a clock, since a node's
    clock may run ahead (`saved_at` is information only). Checkpoints written before `seq` come first, by
    step, as GigaTrain orders them."""
    if not os.path.isdir(models_dir):
        return []
    found = []
    for name in os.listdir(models_dir):
        match = NAME.match(name)
        path = os.path.join(models_dir, name)
        meta = meta_or_none(path) if match else None
        if meta is None:
            continue
        found.append((write_seq(meta), int(match.group(2)), path, meta))
    return sorted(found, key=lambda item: (item[0], item[1]))


def write_seq(meta):
    """meta.json's commit count (0 for checkpoints written before it was recorded)."""
    seq = meta.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else 0


def save_id(path, meta):
    """What identifies a save: its recorded id, else (checkpoints written before ids) its folder name."""
    recorded = meta.get("save_id") if isinstance(meta, dict) else None
    return recorded if isinstance(recorded, str) else "name:" + os.path.basename(os.path.normpath(path))


def weights_finite(paths):
    """Whether the weights in `paths` (files, or folders of them, as state.write_tensors wrote them; a
    folder of shards has a FINITE_KEY file saying it) were all finite when saved: True, False, or None when
    unknown (pickled .bin files, or files written before this was recorded)."""
    from safetensors import safe_open
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += [os.path.join(path, name) for name in sorted(os.listdir(path))]
        else:
            files.append(path)
    found = None
    for path in files:
        if os.path.basename(path) == FINITE_KEY:  # layout.write_shards'
            with open(path) as f:
                value = f.read().strip()
        elif path.endswith(".safetensors") and os.path.isfile(path):
            with safe_open(path, "pt") as f:
                value = (f.metadata() or {}).get(FINITE_KEY)
        else:
            continue
        if value is None:
            return None
        found = (found is not False) and value == "true"
    return found


class CheckpointManager:
    """Writes, finds and rotates the checkpoints of one run in `models_dir`.

    Rotation goes by write order and by lineage: a run deletes only checkpoints of its own history (the
    ones it wrote, the one it resumed from and that one's ancestors, linked through meta.json's
    `parent`), never one that another run wrote (say, newer checkpoints of a branch that an older resume
    abandoned), and never the newest of its history whose weights are finite. `latest()` is the newest
    complete checkpoint by write order (meta.json's `seq`, never a clock)."""

    def __init__(self, models_dir, total_limit=None, keeps=(), keeps_by_epoch=False):
        """`keeps`: steps (epochs with `keeps_by_epoch`, GigaTrain's rule when training by epochs) whose
        checkpoints are never deleted, nor stripped of their optimizer state. `protect(step)` adds a step
        kept the same way whatever the unit of training (the best checkpoint)."""
        self.models_dir, self.total_limit, self.keeps = models_dir, total_limit, set(keeps)
        self.keeps_by_epoch = keeps_by_epoch
        self.protected = set()  # steps, always steps
        self.parent = None  # the save_id this run's next checkpoint descends from

    def protect(self, step):
        self.protected.add(step)

    def release(self, step):
        """`step` goes back into the rotation (unless `keeps` names it)."""
        self.protected.discard(step)

    def latest(self):
        found = _complete(self.models_dir)
        return found[-1][2] if found else None

    def latest_finite(self):
        """The newest complete checkpoint whose weights are finite (or not known to be not), or None:
        what a stop names as the newest good one."""
        return next((path for _, _, path, meta in reversed(_complete(self.models_dir))
                     if meta.get("finite") is not False), None)

    def note_resumed(self, path):
        """This run continues from checkpoint `path`: its saves descend from it (rotation may delete
        it and its ancestors, as the run's own history)."""
        meta = meta_or_none(path)
        self.parent = save_id(path, meta) if meta is not None else None

    def tmp_path(self, epoch, step):
        """Where checkpoint (epoch, step) is written before it is renamed into place."""
        return os.path.join(self.models_dir, TMP_PREFIX + checkpoint_name(epoch, step))

    def begin(self, epoch, step):
        """A fresh temporary folder to write checkpoint (epoch, step) into."""
        os.makedirs(self.models_dir, exist_ok=True)
        self._sweep()
        tmp = self.tmp_path(epoch, step)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        return tmp

    def commit(self, tmp, meta):
        """Record the files' checksums, the weights' finiteness, the commit count (`seq`, the write order),
        the write time (information only) and the lineage in meta.json (written last), make it durable,
        rename into place, then apply the rolling limit."""
        from .checksums import folder_checksums
        from .formats.model_layout import live_weights
        finite = weights_finite([os.path.join(tmp, path) for path in live_weights(meta)])
        seq = 1 + max((item[0] for item in _complete(self.models_dir)), default=0)
        meta = dict(meta, saved_at=time.time(), seq=seq, save_id=uuid.uuid4().hex, parent=self.parent,
                    finite=finite, files=folder_checksums(tmp))
        with open(os.path.join(tmp, META), "w") as f:
            json.dump(meta, f, indent=2, default=repr)  # a Dataset object in the config: its repr
        _fsync_tree(tmp)
        final = os.path.join(self.models_dir, os.path.basename(tmp)[len(TMP_PREFIX):])
        if os.path.exists(final):  # the same step saved again: replace it if it is this run's history
            if save_id(final, meta_or_none(final)) in self._history():
                self._delete(final)
            else:
                aside = self._set_aside(final)
                log.warning("%s was written by another run (not this run's history): kept as %s", final, aside)
        os.rename(tmp, final)
        _fsync_dir(self.models_dir)
        self.parent = meta["save_id"]
        if meta["finite"] is False:
            log.warning("%s holds non-finite weights (NaN/inf); the newest finite checkpoint is kept", final)
        self.rotate()
        return final

    def _history(self):
        """save_ids of this run's history: its newest save (or the checkpoint it resumed) and the
        ancestors reachable through `parent`, newest first, as {save_id: (step, path, finite)}."""
        by_id = {save_id(path, meta): (step, path, meta) for _, step, path, meta in _complete(self.models_dir)}
        history, current = {}, self.parent
        while current in by_id and current not in history:
            step, path, meta = by_id[current]
            history[current] = (step, path, meta.get("finite"))
            current = meta.get("parent")
        return history

    def rotate(self, total_limit=None):
        """Keep the newest `total_limit` (default: the manager's) rolling checkpoints of this run's
        history; `keeps` and protected steps are extra, never deleted; nor is the newest one whose weights
        are finite (or not known to be not), nor a branch point: one that a checkpoint of another history
        (listed, or set aside) descends from, as when this run resumed an older checkpoint."""
        total_limit = total_limit or self.total_limit
        if total_limit is None or total_limit <= 0:
            return
        history = self._history()  # newest first
        if not history:
            return
        entries = list(history.values())
        finite = next((path for _, path, ok in entries if ok is not False), None)
        spared = {finite, entries[0][1]} | {history[i][1] for i in self._branch_points(history)}
        for path in self.rolling()[total_limit:]:
            if path not in spared:
                self._delete(path)

    def _branch_points(self, history):
        """save_ids of `history` that a checkpoint outside it descends from directly (its `parent`)."""
        points = set()
        for name in os.listdir(self.models_dir):
            if not (NAME.match(name) or SET_ASIDE.match(name)):
                continue
            path = os.path.join(self.models_dir, name)
            meta = meta_or_none(path)
            if meta is not None and meta.get("parent") in history and save_id(path, meta) not in history:
                points.add(meta["parent"])
        return points

    def rolling(self):
        """This run's history but the checkpoints `keeps` or `protect` name, newest first."""
        return [path for step, path, _ in self._history().values() if not self.kept(path, step)]

    def kept(self, path, step):
        """Whether checkpoint `path` of `step` is out of the rotation: a protected step, or a keep."""
        if step in self.protected:
            return True
        if self.keeps_by_epoch:
            return int(NAME.match(os.path.basename(path)).group(1)) in self.keeps
        return step in self.keeps

    def strip(self, path, names):
        """Remove files or folders `names` from checkpoint `path` (train.checkpoint_save_optimizer=False).
        meta.json stops listing them first (replaced atomically), so the checkpoint still verifies."""
        present = [name for name in names if os.path.exists(os.path.join(path, name))]
        if not present:
            return
        meta = read_meta(path)
        if isinstance(meta.get("files"), dict):
            meta["files"] = {rel: v for rel, v in meta["files"].items()
                             if rel.split("/", 1)[0] not in present}
        tmp = os.path.join(path, META + TMP_PREFIX)
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=2, default=repr)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(path, META))
        for name in present:
            target = os.path.join(path, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            else:
                os.remove(target)

    def resume_path(self, resume, env=None):
        """The checkpoint to resume from, verified against the checksums recorded at its save, or None.

        resume=True: the newest complete checkpoint by write order whose files are intact and whose weights
        are finite; a damaged one is passed over with one warning line naming the file, the non-finite
        ones with one line naming them all. A path: that checkpoint, or CorruptCheckpointError naming the
        damaged file, CheckpointError when its weights are not finite (ConfigError when it is no
        checkpoint folder).
        Checkpoints without recorded checksums are taken as they are. With `env` (several ranks): the main
        rank decides, every rank gets the same answer (or error).
        The result also becomes this run's parent (note_resumed)."""
        decided = error = None
        if env is None or env.is_main:
            try:
                decided = self._choose(resume)
            except (ConfigError, CheckpointError) as e:
                error = (type(e).__name__, str(e))
        if env is not None and env.world_size > 1:
            import torch.distributed as dist
            if dist.is_initialized():
                shared = [decided, error]
                dist.broadcast_object_list(shared, src=0, group=getattr(env, "cpu_group", None))
                decided, error = shared
        if error is not None:
            kinds = {kind.__name__: kind for kind in (ConfigError, CorruptCheckpointError, CheckpointError)}
            raise kinds.get(error[0], CheckpointError)(error[1])
        if decided is not None:
            self.note_resumed(decided)
        return decided

    def _choose(self, resume):
        if not resume:
            return None
        if resume is not True:
            if not is_complete(resume):  # bad input (exit 2), as before checksums
                raise ConfigError(f"train.resume: {resume} is not a complete checkpoint folder")
            if meta_or_none(resume).get("finite") is False:
                raise CheckpointError(
                    f"train.resume: {resume} holds non-finite weights (NaN/inf; its meta.json says finite: false),"
                    f" from which no step can make progress; nothing was loaded. The newest finite checkpoint is"
                    f" {self.latest_finite() or 'none'} (resume=True takes it)", resume)
            bad = verify(resume)
            if bad is not None:
                raise CorruptCheckpointError(f"train.resume: {bad}; nothing was loaded", resume)
            return resume
        passed = []  # non-finite ones, newest first
        for _, _, path, meta in reversed(_complete(self.models_dir)):
            if meta.get("finite") is False:
                passed.append(os.path.basename(path))
                continue
            bad = verify(path)
            if bad is None:
                _say_passed_over(passed, path)
                return path
            log.warning("resume: passing over %s: %s; trying the checkpoint before it", path, bad)
        _say_passed_over(passed, None)
        log.info("resume: no (intact) checkpoint in %s; starting from step 0", self.models_dir)
        return None

    def _set_aside(self, path):
        """Rename a checkpoint another run wrote out of the way (a name no listing matches): kept."""
        n = 0
        while os.path.exists(f"{path}.superseded_{n}"):
            n += 1
        os.rename(path, f"{path}.superseded_{n}")
        return f"{path}.superseded_{n}"

    def _delete(self, path):
        trash = os.path.join(self.models_dir, TRASH_PREFIX + os.path.basename(path))
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def _sweep(self):
        """Remove what an interrupted write or delete left behind (the project lock keeps other runs out)."""
        for name in os.listdir(self.models_dir):
            if name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(os.path.join(self.models_dir, name), ignore_errors=True)


def _say_passed_over(names, chosen):
    if names:
        log.warning("resume: passing over %d checkpoint%s with non-finite weights (NaN/inf; meta.json finite:"
                    " false): %s; %s", len(names), "s" * (len(names) > 1), ", ".join(names),
                    f"resuming {chosen}" if chosen else "no finite one is left")


def verify(path, under=None):
    """None when every file that checkpoint `path`'s meta.json lists (`under`: only those in that
    sub-folder or file) is there with its recorded size and checksum (or it lists none: written before
    checksums), and its layout stays inside the folder; else one line naming the file."""
    from .checksums import first_mismatch
    from .formats.model_layout import layout_problem
    meta = meta_or_none(path)
    if meta is None:
        return f"{os.path.join(path, META)}: missing or unreadable"
    problem = layout_problem(path, meta)
    if problem is not None:
        return problem
    files = meta.get("files")
    if not isinstance(files, dict):
        return None
    if under is not None:
        files = {rel: v for rel, v in files.items() if rel == under or rel.startswith(under + "/")}
    try:
        bad = first_mismatch(path, files)
    except (TypeError, ValueError):
        return f"{os.path.join(path, META)}: its file list is damaged"
    return None if bad is None else f"{os.path.join(path, bad[0])}: {bad[1]}"


def check_intact(path, doing="read"):
    """Raise CorruptCheckpointError in one line unless `path` (a checkpoint folder, or a model folder or
    file inside one) verifies: what export, convert and load_checkpoint call before reading. A path in
    no checkpoint of ours has nothing recorded to check."""
    path = os.path.normpath(path)
    checkpoint, under = path, None
    if not is_complete(path):
        checkpoint, under = os.path.dirname(path), os.path.basename(path)
        if not is_complete(checkpoint):
            return
    bad = verify(checkpoint, under)
    if bad is not None:
        raise CorruptCheckpointError(f"{bad}; nothing was {doing}", checkpoint)


DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
OS_ERROR_IN_TEXT = re.compile(r"os error (\d+)")


def disk_error(exc):
    """The OSError saying the disk (or quota, or file-size limit) is full, found in `exc`, its causes,
    or the per-rank failures of a torch.distributed.checkpoint error; None when it is something else."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return e
        try:
            text = str(e)
        except Exception:  # e.g. a CheckpointException whose failures are not the pairs its __str__ expects
            text = ""
        code = OS_ERROR_IN_TEXT.search(text)  # safetensors' Rust I/O errors carry only the text
        if code and int(code.group(1)) in DISK_ERRNOS:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
        todo += [e.__cause__, e.__context__]
        for failure in (getattr(e, "failures", None) or {}).values():  # torch 2.13: (exception, traceback)
            todo += [f for f in (failure if isinstance(failure, (tuple, list)) else (failure,))
                     if isinstance(f, BaseException)]
        todo += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
    return None


def free_bytes(path):
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    return shutil.disk_usage(path).free


def _fsync_tree(root):
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(folder)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
