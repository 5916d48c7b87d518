from .logger import MetricLogger, text_logger
from .perf import PerfMeter
from .profiler import StepProfiler
from .run_config import hparams

__all__ = ["MetricLogger", "PerfMeter", "StepProfiler", "hparams", "text_logger"]
