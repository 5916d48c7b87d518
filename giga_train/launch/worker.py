"""`python -m giga_train.launch.worker RESULT_DIR`: one rank spawned by launch_from_config."""
import sys

from .launcher import worker_main

if __name__ == "__main__":
    worker_main(sys.argv[1])
