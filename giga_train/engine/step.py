"""What one optimizer step says: the NaN guard's decision handed to the strategy (Verdict) and what the
strategy's step did (StepResult). The skip is decided on the device (found_inf, an optimizer that honours
it: nothing read on the host) or on the host (the names of what was non-finite)."""
from dataclasses import dataclass

OVERFLOW = "fp16 gradients"  # the name a step skipped by the fp16 loss scaler is counted under

@dataclass
class Verdict:
    """One step's decision: skip on the device where `found_inf` (a device tensor) is 1.0, or, read on
    the host, skip when `nonfinite_names` is not empty."""
    names: tuple
    flags: object  # float32 device tensor, 1.0 where that value was non-finite on some rank
    found_inf: object = None
    nonfinite_names: tuple = ()


@dataclass
class StepResult:
    grad_norm: object = None     # the pre-clip gradient norm (a device tensor), or None when not computed
    nonfinite_names: tuple = ()  # read on the host: what was non-finite on some rank ("loss", "grad_norm")
    skipped: bool = False        # read on the host: the update was not applied (the guard's skip, or the engine's)
    # The skip decided on the device (an optimizer that honours `found_inf`): nothing was read on the host.
    found_inf: object = None     # 0-dim float32 device tensor, 1.0 when this step was skipped on every rank
    flags: object = None         # the all-reduced per-name flags (a device tensor), for the host to settle later
    names: tuple = ()            # the names of `flags`
    loss_scale: object = None    # fp16: the loss scale after a step its scaler skipped (a float, read on the host)
