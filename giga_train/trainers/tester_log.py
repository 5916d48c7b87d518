"""A Tester's trackers, for log_image, log_video and log_figure inside test(): opened at the first call (a
Tester that logs none writes no tracker files), on the main rank, in logging_dir/test (the training's own logs
stay untouched; TensorBoard shows it as the run 'test'), with test.log_with (None: train.log_with); closed
when test() returns (the launcher's call) or at the process's exit."""
import atexit
import os

from ..tracking import MetricLogger


class TesterLog:
    def __init__(self, tester):
        config = tester.config
        self.dir = os.path.join(tester.logging_dir, "test")
        self.metrics = MetricLogger(self.dir, config.test.log_with, tester.is_main_process, 0, 0, 1, show_bar=False,
                                    run_name=os.path.basename(tester.project_dir), config=config.to_dict())
        self.closed = False
        atexit.register(self.close)  # test() called from Python, without the launcher

    def close(self):
        if not self.closed:
            self.closed = True
            self.metrics.close()
            atexit.unregister(self.close)
