"""A folder made from a checkpoint (convert, export), written under `<out>.tmp` and renamed into place
when complete: what an interrupted write left there is removed first, a failed write removes its own,
and a write the system refuses (a full disk, a quota, a file-size limit, permissions) stops in one line
naming the folder."""
import contextlib
import os
import shutil

from ..errors import CheckpointWriteError
from .manager import disk_error

TMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def written_folder(out, what):
    """`with written_folder(out, "convert") as tmp:` write into `tmp`; `out` appears only complete."""
    tmp = out + TMP_SUFFIX
    _remove(tmp)  # an interrupted write's
    try:
        os.makedirs(tmp)
        yield tmp
        os.rename(tmp, out)
    except BaseException as e:
        _remove(tmp)
        problem = write_problem(e)
        if problem is None:
            raise
        raise CheckpointWriteError(f"{what}: {problem}; nothing was written to {out} (what it had written is"
                                   " removed, the checkpoint is unchanged)") from None


def write_problem(error):
    """One line for an error the file system gave while writing (None for anything else: a bug)."""
    disk = disk_error(error)
    if disk is not None:
        return f"{os.strerror(disk.errno)}{' writing ' + str(disk.filename) if disk.filename else ''}"
    if isinstance(error, OSError):
        return f"{error.strerror or error}{' at ' + str(error.filename) if error.filename else ''}"
    text = str(error).strip().splitlines()
    if isinstance(error, RuntimeError) and text and "write" in text[0].lower():  # torch.save's file writer
        return text[0]
    return None


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)
