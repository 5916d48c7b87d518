"""Preemption: SIGTERM or SIGUSR1 asks every rank to finish its step, save a checkpoint and exit 0.

Ranks get the signal at different moments (or only some of them do), so the loop asks `agreed(env)` at
every step end: one tiny all-reduce over gloo, and all ranks stop after the same step."""
import glob
import os
import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionSignals:
    """While active (a context), SIGTERM/SIGUSR1 only set `requested`; the previous handlers come back
    at exit. Outside the main thread, where Python cannot take signals, it does nothing."""

    def __init__(self):
        self.requested = threading.Event()
        self.signal_name = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        self.signal_name = signal.Signals(signum).name
        self.requested.set()

    def agreed(self, env, *more):
        """True on every rank once any rank got a signal (a collective: call it on all ranks). With `more`
        per-rank flags (e.g. a stop one rank found first): a tuple, each agreed in the same all-reduce."""
        return env.agree_any(self.requested.is_set(), *more)


# -- the launcher's side: ranks spawned through the elastic agent ----------------------------------
def pid_file(results, local_rank):
    return os.path.join(results, f"pid_{local_rank}")


def write_pid(results):
    """A spawned rank says who it is, so the launcher can forward SIGUSR1 to it."""
    with open(pid_file(results, os.environ.get("LOCAL_RANK", "0")), "w") as f:
        f.write(str(os.getpid()))


class ForwardSIGUSR1:
    """In the launcher: SIGUSR1 would kill it (the agent handles SIGTERM, not SIGUSR1), so pass it on to
    this machine's ranks instead. Also restores the handlers the agent installs for its own signals."""

    AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

    def __init__(self, results):
        self.results = results
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.getsignal(sig) for sig in self.AGENT_SIGNALS}
            self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._forward)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _forward(self, signum, frame):
        for path in glob.glob(pid_file(self.results, "*")):
            try:
                with open(path) as f:
                    os.kill(int(f.read()), signum)
            except (OSError, ValueError):
                pass  # that rank has already exited, or is just being (re)started
