"""The config schema (GigaTrain's names): defaults and validation that answers in one line, run once before any
rank starts. validate.py checks the whole config over one module per section or form: launch.py, train.py
(train, test), loader.py (dataloaders), classes.py (what a section names to build), values.py, on keys.py's Key."""
from .validate import (LAUNCH, LOADER, SECTIONS, TEST, TRAIN, checkpoint_steps, edit_distance, near_miss,
                       resolve_logging_dir, tester_kwargs, train_kwargs, validate_config, world_size_of)

__all__ = ["LAUNCH", "LOADER", "SECTIONS", "TEST", "TRAIN", "checkpoint_steps", "edit_distance", "near_miss",
           "resolve_logging_dir", "tester_kwargs", "train_kwargs", "validate_config", "world_size_of"]
