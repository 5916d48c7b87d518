from ..compat.giga_datasets import open_dataset
from .loader import DataStream, LoaderStream, as_stream, build_dataset, build_stream
from .samplers import DefaultSampler
from .streaming import StreamingData

__all__ = ["DataStream", "DefaultSampler", "LoaderStream", "StreamingData", "as_stream", "build_dataset",
           "build_stream", "open_dataset"]
