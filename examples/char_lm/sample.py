"""Print text sampled from a char-LM checkpoint: python -m examples.char_lm.sample CHECKPOINT [PROMPT]"""
import os
import sys

import torch

from giga_train import load_config
from giga_train.checkpoint import load_weights, read_meta

from .model import CharLM


def main(checkpoint, prompt="def "):
    meta = read_meta(checkpoint)
    config = load_config(meta["config"]) if "config" in meta else load_config("examples.char_lm.configs.cpu")
    model = CharLM(**config.models)
    model.load_state_dict(load_weights(os.path.join(checkpoint, "model")))
    model.eval()
    tokens = torch.tensor([list(prompt.encode())])
    out = model.generate(tokens, steps=300)[0].tolist()
    print(bytes(out).decode(errors="replace"))


if __name__ == "__main__":
    main(*sys.argv[1:])
