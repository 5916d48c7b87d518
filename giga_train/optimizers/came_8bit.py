"""CAME8Bit: CAME (Luo et al., ACL 2023) with an 8-bit first moment, ~1 byte/param of state.

Factored fp32 statistics for 2-D weights and 1x1 convs with the first moment of the large ones in 8-bit codes
(kernels/qmap.py), fp32 state for the rest. The step is fused Triton on CUDA (kernels/came_bucket.py) and
vectorised torch elsewhere (kernels/came_torch.py), with the whole tensor's statistics on FSDP2 shards and on
DeepSpeed's partitions (came_zero.py): docs/architecture.md, "CAME8Bit's step"."""
import torch

from ..registry import OPTIMIZERS
from .closure import closure_loss
from .kernels import came_torch, use_kernels
from .kernels.state_io import load_state_keep_dtypes

ZERO_FLAT_ERROR = ("CAME8Bit got flat 1-D partitions it was not told the layout of (a DeepSpeed engine "
                   "set up without calling optimizer.bind_deepspeed(engine.optimizer, "
                   "model.named_parameters()) after deepspeed.initialize), so the row/column factors "
                   "would be lost")


def factored_rows(shape):
    return came_torch.factored_view_shape(shape)[0]


def _is_fsdp1_flat_param(p):
    try:
        from torch.distributed.fsdp._flat_param import FlatParameter
    except ImportError:
        return False
    return isinstance(p, FlatParameter)


@OPTIMIZERS.register
class CAME8Bit(torch.optim.Optimizer):
    """CAME with 8-bit blockwise first moment. `backend`: 'auto' (Triton on CUDA), 'torch', 'triton'.

    found_inf: when the attribute `found_inf` is set (a 1-element fp32 tensor on the parameters'
    device, e.g. by the trainer's NaN guard) and holds a value > 0 at step time, the step leaves
    parameters and all state, step count included, unchanged; decided on the device."""

    supports_found_inf = True

    def __init__(self, params, lr, betas=(0.9, 0.999, 0.9999), eps=(1e-30, 1e-16), clip_threshold=1.0,
                 weight_decay=0.0, block_size=2048, min_8bit_size=16384):
        if not lr > 0:
            raise ValueError(f"CAME8Bit: lr must be > 0, got {lr}")
        if len(betas) != 3 or not all(0.0 <= b <= 1.0 for b in betas):
            raise ValueError(f"CAME8Bit: betas must be three values in [0, 1], got {betas}")
        if len(eps) != 2:
            raise ValueError(f"CAME8Bit: eps must be a pair (eps1, eps2), got {eps}")
        if int(block_size) < 1:
            raise ValueError(f"CAME8Bit: block_size must be >= 1, got {block_size}")
        self._registered, self._registered_vectors = set(), set()
        self._saw_factored = False
        defaults = dict(lr=lr, betas=tuple(betas), eps=tuple(eps), clip_threshold=clip_threshold,
                        weight_decay=weight_decay)
        self.block_size, self.min_8bit_size = int(block_size), int(min_8bit_size)
        self.backend = "auto"
        self._state_version = 0
        self._buckets = {}
        self._shard_groups = {}  # id(DTensor param) -> its shard group for the kernels, or None
        self._zero = {}  # id(flat partition) -> came_zero.FlatLayout, under DeepSpeed
        self._views = {}
        super().__init__(params, defaults)

    # FSDP1 (use_orig_params) shows the optimizer each weight's shard as a flat 1-D view: no 2-D shape to factor
    FSDP1_REFUSAL = ("FSDP1 hands the optimizer flat 1-D shards, which would make its factored 8-bit state "
                     "unfactored fp32 (8 B/param); use fsdp_version=2 or DeepSpeed ZeRO")

    @classmethod
    def check_zero_compatible(cls, stage, dtype=torch.float32):
        """For the DeepSpeed strategy: every ZeRO stage and precision works (came_zero.py), given
        bind_deepspeed after deepspeed.initialize."""

    def bind_deepspeed(self, engine_optimizer, named_parameters):
        """After deepspeed.initialize: learn which piece of which weight each flat partition that
        DeepSpeed hands this optimizer holds (a collective; see came_zero.py)."""
        from . import came_zero
        self._zero = came_zero.bind(engine_optimizer, list(named_parameters))
        self._views, self._buckets = {}, {}

    def load_state_by_name(self, state_by_name):
        """Whole-tensor state by parameter name (any strategy's portable form) into the pieces this
        rank holds under DeepSpeed."""
        from . import came_zero
        for layout in self._zero.values():
            flat, pieces = layout.flat, {}
            for pc in layout.whole:
                if pc.name in state_by_name:
                    st = came_zero.whole_state_from_full(state_by_name[pc.name], self._view(flat, pc),
                                                         self.block_size, self.min_8bit_size)
                    pieces[pc.name] = dict(st, frag_start=0, frag_numel=pc.total, block_size=self.block_size)
            for pc in layout.cut:
                if pc.numel and pc.name in state_by_name:
                    pieces[pc.name] = came_zero.piece_state_from_full(state_by_name[pc.name], pc, flat,
                                                                      self.block_size, self.min_8bit_size)
            self.state[flat] = {"came": pieces}
        self._state_version += 1
        self._buckets.clear()

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            if _is_fsdp1_flat_param(p):
                raise ValueError("CAME8Bit got FSDP1 flat parameters (use_orig_params=False), which lose the "
                                 "2-D shapes it factors: use fsdp_version=2, or use_orig_params=True")
            self._registered.add(id(p))
            if p.dim() == 1:
                self._registered_vectors.add(p.numel())
            self._saw_factored |= came_torch.factored_view_shape(p.shape) is not None

    def _view(self, flat, pc):
        """A whole weight inside a flat partition, as a persistent view (the buckets key on it)."""
        key = (id(flat), pc.name)
        view = self._views.get(key)
        if view is None or view.data_ptr() != flat.data_ptr() + pc.flat_offset * flat.element_size():
            view = self._views[key] = pc.view(flat)
        return view

    def _step_flat(self, gi, group, flat, layout, kernel_work, skip):
        """One DeepSpeed flat partition: its whole weights as in one process (views), its cut weights
        by came_zero.step_split, with the statistics of the whole weights (collectives)."""
        from . import came_zero
        pieces = self.state[flat].setdefault("came", {})
        grad = flat.grad
        for k, pc in enumerate(layout.whole):
            view, gview = self._view(flat, pc), pc.view(grad)
            st = pieces.get(pc.name)
            fresh = st is None
            if fresh:
                st = pieces[pc.name] = dict(frag_start=0, frag_numel=pc.total, block_size=self.block_size)
                came_torch.init_state(view, st, self.block_size, self.min_8bit_size, lazy=True)
            kind = self._kernel_kind(view, st, gview)
            if kind is None:
                if fresh:
                    came_torch.materialize_(st, view.device)
                came_torch.came_step_(view, gview, st, group, self.block_size, (gi, k), skip)
            else:
                kernel_work.setdefault(kind, []).append(((gi, k), view, gview, st))
        work = []
        for pc in layout.cut:
            if not pc.numel:
                work.append((pc, None, None, None))
                continue
            st = pieces.get(pc.name)
            if st is None:
                st = pieces[pc.name] = came_zero.init_piece_state(pc, flat, self.block_size, self.min_8bit_size)
            work.append((pc, pc.view(flat), pc.view(grad), st))
        if work:
            came_zero.step_split(work, group, layout.group, self.block_size, self.min_8bit_size, flat.device, skip)

    def _check_not_flattened(self, p):
        # A wrapper that swapped our param_groups for flat partitions (DeepSpeed ZeRO) shows up as
        # parameters we were never given, all 1-D, where we were given matrices.
        # (DeepSpeed's FP16_UnfusedOptimizer, bf16 at stage 0, hands fp32 copies of each tensor: a copy
        # of a bias has a registered vector's size)
        if id(p) not in self._registered and p.dim() == 1 and self._saw_factored \
                and p.numel() not in self._registered_vectors:
            raise RuntimeError(ZERO_FLAT_ERROR)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        flag = self._found_inf()
        skip = None if flag is None else flag.reshape(()) > 0
        for gi, group in enumerate(self.param_groups):
            kernel_work = {}
            for pi, p in enumerate(group["params"]):
                layout = self._zero.get(id(p))
                if layout is not None:  # a DeepSpeed flat partition (every rank steps it: collectives)
                    if p.grad is None:
                        raise RuntimeError("CAME8Bit: a DeepSpeed flat partition without a gradient")
                    self._step_flat(gi, group, p, layout, kernel_work, skip)
                    continue
                if p.grad is None:
                    continue
                self._check_not_flattened(p)
                if p.grad.is_sparse:
                    raise RuntimeError("CAME8Bit does not support sparse gradients")
                state = self.state[p]
                fresh = len(state) == 0
                if fresh:  # lazy: a bucket allocates it once (a DTensor's is made at once)
                    came_torch.init_state(p, state, self.block_size, self.min_8bit_size, lazy=True)
                kind = self._kernel_kind(p, state, p.grad)
                if kind is None:
                    if fresh:  # only a state made just now can be lazy: later steps skip the look
                        came_torch.materialize_(state, p.device)
                    came_torch.came_step_(p, p.grad, state, group, self.block_size, (gi, pi), skip)
                else:
                    kernel_work.setdefault(kind, []).append(((gi, pi), p, p.grad, state))
            for kind, work in kernel_work.items():
                bucket = self._bucket(gi, kind, work)
                bucket.step([came_torch.local(g) for _, _, g, _ in work], group, flag)
        return loss

    def _found_inf(self):
        """The trainer's device flag (1-element fp32: > 0 skips the step), or None."""
        flag = getattr(self, "found_inf", None)
        if flag is not None and (not torch.is_tensor(flag) or flag.numel() != 1):
            raise ValueError("CAME8Bit.found_inf must be a 1-element tensor on the parameters' device")
        return flag

    def _kernel_kind(self, p, state, g):
        """Bucket key for the fused path, or None for the torch path."""
        if not use_kernels(self.backend, came_torch.local(p)):
            return None
        from .kernels import came_bucket
        if came_torch.is_dtensor(p):  # FSDP2 shards: the kernels on the local rows, whole-tensor sums all-reduced
            if id(p) not in self._shard_groups:  # DTensor facts cost ~0.1 ms a tensor: once, not every step
                self._shard_groups[id(p)] = came_bucket.shard_group(p)
            group, lp, lg = self._shard_groups[id(p)], came_torch.local(p), came_torch.local(g)
            if group is None:
                return None
            if "exp_avg_sq_row" in state and len(came_torch.factored_view_shape(p.shape)) == 2 \
                    and came_bucket.factored_eligible(lp, lg, self.block_size):
                return ("sharded", p.dtype, g.dtype, "exp_avg_codes" in state, lp.device, group)
            if "exp_avg_sq" in state and p.dim() == 1 and came_bucket.vector_eligible(lp, lg):
                return ("sharded_vector", p.dtype, g.dtype, False, lp.device, group)
            return None
        if "exp_avg_sq_row" in state and came_bucket.factored_eligible(p, g, self.block_size):
            return ("factored", p.dtype, g.dtype, "exp_avg_codes" in state, p.device)
        if "exp_avg_sq" in state and came_bucket.vector_eligible(p, g):
            return ("vector", p.dtype, g.dtype, False, p.device)
        return None

    def _bucket(self, gi, kind, work):
        from .kernels import came_bucket
        key = (gi, kind)
        ids = tuple(id(p) for _, p, _, _ in work)
        cached = self._buckets.get(key)
        if cached is not None and cached[0] == ids and cached[1] == self._state_version:
            return cached[2]
        params = [p for _, p, _, _ in work]
        states = [st for _, _, _, st in work]
        positions = [pos for pos, _, _, _ in work]
        if kind[0] == "sharded":
            rows = [factored_rows(p.shape) for p in params]
            bucket = came_bucket.ShardedFactoredBucket([came_torch.local(p) for p in params], states, positions,
                                                       self.block_size, kind[3], rows, kind[5])
        elif kind[0] == "sharded_vector":
            bucket = came_bucket.ShardedVectorBucket([came_torch.local(p) for p in params], states, positions,
                                                     [p.numel() for p in params], kind[5])
        elif kind[0] == "factored":
            bucket = came_bucket.FactoredBucket(params, states, positions, self.block_size, kind[3])
        else:
            bucket = came_bucket.VectorBucket(params, states, positions)
        self._buckets[key] = (ids, self._state_version, bucket)
        return bucket

    def load_state_dict(self, state_dict):
        """Load without torch's cast of every floating state tensor to the parameter's dtype: codes
        stay uint8 and statistics fp32 (see state_io)."""
        load_state_keep_dtypes(self, state_dict, super().load_state_dict)
        for p, state in self.state.items():
            if isinstance(state.get("came"), dict):  # DeepSpeed pieces (came_zero): on the partition's device
                dev = came_torch.local(p).device
                state["came"] = {name: {k: v.to(device=dev, copy=True) if torch.is_tensor(v) else v
                                        for k, v in piece.items()} for name, piece in state["came"].items()}
        for p, state in self.state.items():  # older checkpoints hold the step as a Python int
            if "step" in state and not torch.is_tensor(state["step"]):
                state["step"] = torch.tensor(float(state["step"]), device=came_torch.local(p).device)
        self._state_version += 1
        self._buckets.clear()
