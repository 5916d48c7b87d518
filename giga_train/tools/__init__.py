"""Tools over a config or a checkpoint without a training run: plan, memory counts, export, convert and
the offline Trainer they build on."""
