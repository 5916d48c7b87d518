from .giga_datasets import open_dataset
from .loader import DataStream, LoaderStream, as_stream, build_dataset
from .samplers import DefaultSampler

__all__ = ["DataStream", "DefaultSampler", "LoaderStream", "as_stream", "build_dataset", "open_dataset"]
