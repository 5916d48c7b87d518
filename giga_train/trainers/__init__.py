from .runner import Runner
from .tester import Tester
from .trainer import Trainer

__all__ = ["Runner", "Tester", "Trainer"]
