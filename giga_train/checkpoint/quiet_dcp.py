"""torch.distributed.checkpoint called in one process (no process group): without the UserWarning DCP gives at
every such save and load ("torch.distributed is disabled, unavailable or uninitialized, assuming the intent is
to save in a single process"), which is what we mean and which breaks the progress bar's line each time."""
import contextlib
import warnings

SINGLE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to"


@contextlib.contextmanager
def quiet_single_process():
    """That one warning ignored inside the block; every other warning as before."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING, category=UserWarning)
        yield
