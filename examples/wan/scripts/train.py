"""Train a Wan config: python examples/wan/scripts/train.py CONFIG [--set key=value ...]

The same as `giga-train train CONFIG`; kept because GigaTrain's Wan example is started this way."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # `examples.wan...` resolves from any working directory

from giga_train.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
