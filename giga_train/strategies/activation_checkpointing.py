"""GigaTrain's import path for module_auto_wrap_policy."""
from ..compat.utils import module_auto_wrap_policy

__all__ = ["module_auto_wrap_policy"]
