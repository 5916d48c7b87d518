"""Checkpoint folders: atomic writes, the newest complete one, and the rolling limit.

`{project_dir}/models/checkpoint_epoch_{E}_step_{S}/` appears only complete: it is written under a
hidden temporary name and renamed at the end. Deletions rename first too, so a half-deleted folder
never looks like a checkpoint."""
import errno
import json
import os
import re
import shutil

NAME = re.compile(r"^checkpoint_epoch_(\d+)_step_(\d+)$")
META = "meta.json"
TMP_PREFIX = ".tmp_"
TRASH_PREFIX = ".trash_"


def checkpoint_name(epoch, step):
    return f"checkpoint_epoch_{epoch}_step_{step}"


def is_complete(path):
    return NAME.match(os.path.basename(os.path.normpath(path))) is not None and os.path.isfile(
        os.path.join(path, META))


def list_checkpoints(models_dir):
    """Complete checkpoints as (step, path), oldest first."""
    if not os.path.isdir(models_dir):
        return []
    found = []
    for name in os.listdir(models_dir):
        match = NAME.match(name)
        path = os.path.join(models_dir, name)
        if match and is_complete(path):
            found.append((int(match.group(2)), path))
    return sorted(found)


def read_meta(path):
    with open(os.path.join(path, META)) as f:
        return json.load(f)


class CheckpointManager:
    def __init__(self, models_dir, total_limit=None, keeps=()):
        self.models_dir, self.total_limit, self.keeps = models_dir, total_limit, set(keeps)

    def latest(self):
        found = list_checkpoints(self.models_dir)
        return found[-1][1] if found else None

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
        """Write meta.json last, make it durable, rename into place, then apply the rolling limit."""
        with open(os.path.join(tmp, META), "w") as f:
            json.dump(meta, f, indent=2, default=repr)  # a Dataset object in the config: its repr
        _fsync_tree(tmp)
        final = os.path.join(self.models_dir, os.path.basename(tmp)[len(TMP_PREFIX):])
        if os.path.exists(final):  # the same step saved again (e.g. a resumed run): replace it whole
            self._delete(final)
        os.rename(tmp, final)
        _fsync_dir(self.models_dir)
        self.rotate()
        return final

    def rotate(self):
        """Keep the newest `total_limit` rolling checkpoints; `keeps` steps are extra, never deleted."""
        if self.total_limit is None:
            return
        found = list_checkpoints(self.models_dir)
        rolling = [(s, p) for s, p in found if s not in self.keeps]
        newest = found[-1][1] if found else None
        for _, path in rolling[:max(len(rolling) - self.total_limit, 0)]:
            if path != newest:
                self._delete(path)

    def _delete(self, path):
        trash = os.path.join(self.models_dir, TRASH_PREFIX + os.path.basename(path))
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def _sweep(self):
        """Remove what an interrupted write or delete left behind."""
        for name in os.listdir(self.models_dir):
            if name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(os.path.join(self.models_dir, name), ignore_errors=True)


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
        code = OS_ERROR_IN_TEXT.search(str(e))  # safetensors' Rust I/O errors carry only the text
        if code and int(code.group(1)) in DISK_ERRNOS:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
        todo += [e.__cause__, e.__context__]
        todo += [f for f in getattr(e, "failures", {}).values() if isinstance(f, BaseException)]
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
