"""The config tests/test_disk_full.py resumes under a file-size limit (project_dir set by --set)."""
from tests.tiny import tiny_config

config = tiny_config("unset", max_steps=4, checkpoint_interval=2, resume=True, with_ema=False)
