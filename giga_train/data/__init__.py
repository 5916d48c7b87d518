from .loader import DataStream, build_dataset
from .samplers import DefaultSampler

__all__ = ["DataStream", "DefaultSampler", "build_dataset"]
