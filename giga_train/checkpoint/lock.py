"""One run per project_dir: a lock file `{project_dir}/.giga_train.lock` holding the owner's pid, host
and start time, locked with fcntl.lockf while the run lives.

The kernel releases the lock when its process dies (kill -9 included), so a stale file is simply taken
over. lockf locks belong to the process, not to the file descriptor: DataLoader workers forked from it
do not hold it, and a restarted rank never waits for a dying worker. A second run (on this machine, or
another machine through a file system with working POSIX locks) is refused in one line naming the
holder. Within one process a path is held once (POSIX locks do not conflict inside a process).
A models/ folder that resolves elsewhere (a symlink: one folder for two project_dirs) is covered too:
its run also holds the lock file of the folder that holds the resolved one."""
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
        self.path = os.path.join(os.path.realpath(project_dir), LOCK_FILE)
        self.fds = {}  # lock file -> descriptor, while held

    @property
    def fd(self):
        return self.fds.get(self.path)

    def models_lock_path(self):
        """Where models/ resolves to another folder (a symlink, one folder for two project_dirs), the
        lock file of the folder holding it (that project's own lock): runs whose models/ are one folder
        exclude each other, so one run's clean-up never removes another's checkpoint in flight. None when
        models/ is project_dir's own."""
        resolved = os.path.realpath(os.path.join(os.path.dirname(self.path), "models"))
        path = os.path.join(os.path.dirname(resolved), LOCK_FILE)
        return None if path == self.path else path

    def acquire(self):
        """Take the lock, or raise ProjectLockedError in one line: another live run holds it (or the
        folder models/ resolves to), or project_dir is not a writable folder."""
        with _GUARD:
            if self.path in _HELD:
                raise ProjectLockedError(f"project_dir {self.project_dir}: already in use by a run in this process;"
                                         " give each run its own project_dir")
            self._take(self.path, f"project_dir {self.project_dir}", "checkpoints and logs go there")
            for sub in ("models", "logs"):  # found at the start, not at the first save
                folder = os.path.join(os.path.dirname(self.path), sub)
                if os.path.exists(folder) and not (os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)):
                    self._let_go()
                    raise ProjectLockedError(f"project_dir {self.project_dir}: {sub}/ is not a writable folder"
                                             f" ({'checkpoints' if sub == 'models' else 'logs'} go there)")
            shared = self.models_lock_path()
            if shared is not None:
                models = os.path.realpath(os.path.join(os.path.dirname(self.path), "models"))
                if shared in _HELD:
                    self._let_go()
                    raise ProjectLockedError(f"project_dir {self.project_dir}: its models/ is {models}, in use by a"
                                             " run in this process; give each run its own models folder")
                self._take(shared, f"project_dir {self.project_dir} (its models/ is {models})", "")
            for path in self.fds:
                _HELD[path] = self
        return self

    def _take(self, path, who, why):
        """Open, lock and stamp lock file `path` (kept in self.fds), or let go of all and raise in one line."""
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            self._let_go()
            raise ProjectLockedError(f"{who}: not a writable folder ({e.strerror or e})"
                                     f"{'; ' + why if why else ''}") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _describe(fd)
            os.close(fd)
            self._let_go()
            raise ProjectLockedError(
                f"{who}: in use by another run ({holder}); wait for it to end, or give this run another"
                f" project_dir (the lock is {path})") from None
        self.fds[path] = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(dict(pid=os.getpid(), host=socket.gethostname(),
                                          since=time.strftime("%Y-%m-%d %H:%M:%S"))).encode() + b"\n", 0)
        except OSError as e:  # a full disk, a quota, a file-size limit
            self._let_go()
            raise ProjectLockedError(f"project_dir {self.project_dir}: cannot write its lock file {path}"
                                     f" ({e.strerror or e}); nothing was started") from None

    def _let_go(self):
        for path, fd in self.fds.items():
            try:
                os.ftruncate(fd, 0)  # the file stays (removing it could race another run's open)
            except OSError:
                pass
            fcntl.lockf(fd, fcntl.LOCK_UN)
            os.close(fd)
            _HELD.pop(path, None)
        self.fds = {}

    def release(self):
        with _GUARD:
            self._let_go()

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
