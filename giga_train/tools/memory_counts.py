"""The memory counts `plan` uses (parameters, optimizer state, activations): they live in
trainers/memory_counts.py, where the trainer's automatic activation checkpointing counts too."""
from ..trainers.memory_counts import (ActivationCount, ParameterCount, count_activations,  # noqa: F401
                                      count_parameters, optimizer_state_bytes)
