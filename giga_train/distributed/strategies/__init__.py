"""Importing this package registers every strategy in STRATEGIES (one file each)."""
from .base import Strategy

__all__ = ["Strategy"]
