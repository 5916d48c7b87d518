"""Named scalars that are not trained (Trainer.log_metric), and validation results: summed on the device
as they come (no host read), averaged over the calls and the ranks only when they are logged."""
import torch
import torch.distributed as dist


class MetricSums:
    """name -> (weighted sum, weight) on the device. `average()` is the one place that reads them: a
    collective in a job of several ranks, so every rank calls it at the same point."""

    def __init__(self, device):
        self.device = device
        self.weight = 1.0  # of an add() that gives none (validation sets its batch's sample count)
        self._sums, self._weights = {}, {}

    def add(self, name, value, weight=None):
        """`value`: a number or a tensor (its mean); `weight`: how much it counts in the average (None:
        `self.weight`). Detached: a metric never trains."""
        weight = self.weight if weight is None else weight
        if not isinstance(name, str):
            raise TypeError(f"log_metric: the name must be a string, got {name!r}")
        if torch.is_tensor(value):
            value = value.detach().float().mean().to(self.device)
        else:
            value = float(value)  # stays on the host: a copy to the GPU per call would wait for its queue
        self._sums[name] = self._sums.get(name, 0.0) + value * weight
        self._weights[name] = self._weights.get(name, 0.0) + weight

    def __bool__(self):
        return bool(self._sums)

    def average(self, group=None, cpu_group=None):
        """{name: float}: each name's weighted mean over every rank's adds since the last call, then empty.
        The names are agreed first (a rank may log a name the others never do); a name no rank added
        since the last call is left out."""
        names = sorted(self._sums)
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
        if distributed:
            everyone = [None] * dist.get_world_size(cpu_group or group)
            dist.all_gather_object(everyone, names, group=cpu_group or group)
            names = sorted(set().union(*everyone))
        if not names:
            return {}
        sums = torch.stack([torch.as_tensor(self._sums.get(n, 0.0), dtype=torch.float32, device=self.device)
                            for n in names])
        weights = torch.tensor([self._weights.get(n, 0.0) for n in names], device=self.device)
        both = torch.cat([sums, weights])
        if distributed:
            dist.all_reduce(both, group=group)  # SUM: a rank's weight counts as much as its adds
        self._sums, self._weights = {}, {}
        sums, weights = both.tolist()[:len(names)], both.tolist()[len(names):]
        return {n: s / w for n, s, w in zip(names, sums, weights) if w > 0}
