"""One run per project_dir: a lock file `{project_dir}/.giga_train.lock` holding the owner's pid, host
and start time, locked with fcntl.lockf while the run lives.

The kernel releases the lock when its process dies (kill -9 included), so a stale file is simply taken
over. lockf locks belong to the process, not to the file descriptor: DataLoader workers forked from it
do not hold it, and a restarted rank never waits for a dying worker. A second run (on this machine, or
another machine through a file system with working POSIX locks) is refused in one line naming the
holder. Within one process a path is held once (POSIX locks do not conflict inside a process)."""
import fcntl
import json
import os
import socket
import threading
import time

from ..errors import ProjectLockedError

LOCK_FILE = ".giga_train.lock"
_HELD = {}
_GUARD = threading.Lock()


class ProjectLock:
    def __init__(self, project_dir):
        self.project_dir = project_dir
        self.path = os.path.join(os.path.abspath(project_dir), LOCK_FILE)
        self.fd = None

    def acquire(self):
        """Take the lock, or raise ProjectLockedError in one line: another live run holds it, or
        project_dir is not a writable folder."""
        with _GUARD:
            if self.path in _HELD:
                raise ProjectLockedError(f"project_dir {self.project_dir}: already in use by a run in this process;"
                                         " give each run its own project_dir")
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as e:
                raise ProjectLockedError(f"project_dir {self.project_dir}: not a writable folder"
                                         f" ({e.strerror or e}); checkpoints and logs go there") from None
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _describe(fd)
                os.close(fd)
                raise ProjectLockedError(
                    f"project_dir {self.project_dir}: in use by another run ({holder}); wait for it to end,"
                    f" or give this run another project_dir (the lock is {self.path})") from None
            for sub in ("models", "logs"):  # found at the start, not at the first save
                folder = os.path.join(os.path.dirname(self.path), sub)
                if os.path.exists(folder) and not (os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)):
                    fcntl.lockf(fd, fcntl.LOCK_UN)
                    os.close(fd)
                    raise ProjectLockedError(f"project_dir {self.project_dir}: {sub}/ is not a writable folder"
                                             f" ({'checkpoints' if sub == 'models' else 'logs'} go there)")
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(dict(pid=os.getpid(), host=socket.gethostname(),
                                              since=time.strftime("%Y-%m-%d %H:%M:%S"))).encode() + b"\n", 0)
            except OSError as e:  # a full disk, a quota, a file-size limit
                fcntl.lockf(fd, fcntl.LOCK_UN)
                os.close(fd)
                raise ProjectLockedError(f"project_dir {self.project_dir}: cannot write its lock file {self.path}"
                                         f" ({e.strerror or e}); nothing was started") from None
            self.fd = fd
            _HELD[self.path] = self
        return self

    def release(self):
        with _GUARD:
            if self.fd is None:
                return
            try:
                os.ftruncate(self.fd, 0)  # the file stays (removing it could race another run's open)
            except OSError:
                pass
            fcntl.lockf(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
            _HELD.pop(self.path, None)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _describe(fd):
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError):
        return "a process that is still starting"
