from .logger import MetricLogger, text_logger

__all__ = ["MetricLogger", "text_logger"]
