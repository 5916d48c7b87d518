"""What one process's training state and one micro-batch's activations take, counted without memory:
parameters and the optimizer's real state on the meta device (the config's own get_optimizers, stepped
once), activations as autograd's saved tensors of one forward_step on fake tensors (FakeTensorMode: shapes
and dtypes only, under the run's CPU autocast); the blocks train.dynamo_config compiles as inductor's
partitioner saves them (compiled_saves.py); under mixed_precision="fp8" with torchao's float8 Linears."""
import contextlib
import importlib.util
import logging
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..engine.activation_checkpointing import SELECTIVE_SAVED_OPS
from ..engine.block_classes import parse_class_names, repeated_block_classes
from ..data import as_stream
from ..engine.precision import AUTOCAST_DTYPES
from ..compat.utils import as_list
from .compiled_saves import block_saves, tensor_leaves, traces_compiled

log = logging.getLogger("giga_train")


@dataclass
class ParameterCount:
    numel: int = 0
    trainable_numel: int = 0
    bytes: int = 0            # as get_models builds them (their dtypes)
    trainable_bytes: int = 0
    buffer_bytes: int = 0
    by_dtype: dict = field(default_factory=dict)  # {"torch.float32": {"numel", "trainable"}}
    units: list = field(default_factory=list)     # numel of each FSDP wrap unit (its own parameters)
    root_numel: int = 0                           # parameters outside every wrap unit


def count_parameters(model, wrap_classes=()):
    count = ParameterCount()
    in_unit = set()
    for module in model.modules():
        if type(module).__name__ in wrap_classes:
            own = [p for p in module.parameters() if id(p) not in in_unit]
            in_unit.update(id(p) for p in own)
            count.units.append(sum(p.numel() for p in own))
    for p in model.parameters():  # tied weights once, as named_parameters gives them
        size = p.numel() * p.element_size()
        row = count.by_dtype.setdefault(str(p.dtype), dict(numel=0, trainable=0))
        row["numel"] += p.numel()
        count.numel, count.bytes = count.numel + p.numel(), count.bytes + size
        if p.requires_grad:
            row["trainable"] += p.numel()
            count.trainable_numel, count.trainable_bytes = count.trainable_numel + p.numel(), \
                count.trainable_bytes + size
        if id(p) not in in_unit:
            count.root_numel += p.numel()
    count.buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    return count


def optimizer_state_bytes(trainer, model):
    """Bytes of the optimizer state after one step: the trainer's get_optimizers over `model` (on the meta
    device), each trainable parameter given a gradient, stepped once; every tensor in optimizer.state."""
    trainer._models = [model]
    optimizers = as_list(trainer.get_optimizers(_unfused(trainer.config.optimizers)))
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.empty_like(p)
    with torch.no_grad():
        for optimizer in optimizers:
            optimizer.step()
    total = sum(_tensor_bytes(state) for optimizer in optimizers for state in optimizer.state.values())
    names = sorted({type(o).__name__ for o in optimizers})
    return total, names


def _unfused(configs):
    """Optimizer configs without torch's `fused` flag, whose kernels refuse the meta device; the state
    they keep is the same."""
    if isinstance(configs, dict):
        return {k: v for k, v in configs.items() if k != "fused"}
    if isinstance(configs, (list, tuple)):
        return [_unfused(c) for c in configs]
    return configs


def _tensor_bytes(value):
    if torch.is_tensor(value):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


@dataclass
class ActivationCount:
    saved: int           # bytes autograd keeps for backward after one micro-batch's forward
    checkpointed: int    # the same with each block of `block_classes` checkpointed (see below)
    block_classes: list
    blocks: int
    largest_block: int   # the most one block saves (recomputed in backward under checkpointing)
    block_inputs: int    # what checkpointing keeps of the blocks: their inputs (and RNG states)
    note: str = ""
    per_block: list = field(default_factory=list)         # what each block saves, in the order they run
    per_block_inputs: list = field(default_factory=list)  # the inputs each block adds to those kept (bytes)
    block_order: list = field(default_factory=list)       # each block's class name, in the order they run
    rng_per_block: int = 0                                # the RNG state checkpoint keeps per block
    before_blocks: int = 0                                # saved outside the blocks before the last one ran
    per_block_outputs: list = field(default_factory=list)  # bytes of each block's output tensors
    per_block_own_inputs: list = field(default_factory=list)  # of per_block_inputs, what the block saves too
    per_block_params: list = field(default_factory=list)  # trainable parameters (numel) of each block
    trainable_numel: int = 0                              # trainable parameters of the whole model
    largest_after_blocks: int = 0                         # the largest save after the last block (the head's)
    per_block_casts: list = field(default_factory=list)   # autocast's copies of each block's trainable weights
    unsaved_casts: list = field(default_factory=list)     # of those, what nothing saves (per block, then outside)
    per_block_selective: list = field(default_factory=list)  # outputs of the ops "selective" keeps, per block
    per_block_selective_unsaved: list = field(default_factory=list)  # of those, what autograd does not save
    per_block_checkpoint_keeps: list = field(default_factory=list)  # what a checkpointed block keeps besides
    # its inputs (compiled: the partitioner's saves that are not inputs); empty: the RNG state (rng_per_block)
    compiled: bool = False  # the blocks counted as inductor compiles them

    def _checkpoint_keeps(self, k):
        return self.per_block_checkpoint_keeps[k] if self.per_block_checkpoint_keeps else self.rng_per_block

    def with_first_checkpointed(self, n, selective=False):
        """The bytes saved for backward with the first `n` blocks (in run order) checkpointed: their own
        saves replaced by their inputs and RNG states, plus the largest of them recomputed in backward.
        `selective`: they keep their matmul and attention outputs too, and recompute the rest."""
        if n <= 0 or not self.per_block:
            return self.saved
        n = min(n, len(self.per_block))
        kept = self._kept(n, selective)
        back = [self.per_block[k] + (self.per_block_selective_unsaved[k] - self.per_block_selective[k]
                                     if selective else 0) for k in range(n)]
        return self.saved - sum(self.per_block[:n]) + sum(kept[:n]) + max(back)

    def _kept(self, n, selective=False):
        """What each block holds between its forward and its backward: the first `n` (checkpointed) their
        inputs and RNG state (and under `selective` their matmul and attention outputs), the rest their saves."""
        extra = self.per_block_selective if selective else [0] * len(self.per_block)
        return [self.per_block_inputs[k] + self._checkpoint_keeps(k) + extra[k] if k < n else self.per_block[k]
                for k in range(len(self.per_block))]

    def backward_peak(self, n, grads, accumulation=1, sp=1, selective=False):
        """The most activations and gradients hold at once (bytes per rank) with the first `n` blocks
        checkpointed (`selective`: selectively), `grads` the bytes of all gradients on this rank,
        activations split over `sp` ranks.
        Backward runs the head, then the blocks last to first. In the head's, everything the forward kept is
        held, with the gradient flowing through its largest save (in and out: twice its size). While block k
        runs its backward, the blocks before it hold what they keep (inputs if checkpointed, else their
        saves), block k holds all it saves (recomputed if checkpointed) and the gradient flowing through it
        (its output's size, twice), beside the gradients made so far: those of the blocks after it and, as a
        bound, of every parameter outside the blocks. Accumulating, the earlier micro-batches' gradients
        are held throughout."""
        blocks = len(self.per_block)
        if not blocks or not self.trainable_numel:
            act = self.with_first_checkpointed(n, selective) / sp
            return int(grads + act if accumulation > 1 else max(grads, act))
        n = max(0, min(n, blocks))
        kept = self._kept(n, selective)
        unsaved = self.per_block_selective_unsaved if selective else [0] * blocks
        block_grads = [grads * p / self.trainable_numel for p in self.per_block_params]
        whole = grads if accumulation > 1 else 0
        outside = self.saved - sum(self.per_block)
        # autocast keeps its copies of the weights until the forward_step ends: those nothing else saves
        casts = sum(self.per_block_casts[:n]) + sum(self.unsaved_casts[n:]) if self.unsaved_casts else 0
        head = (outside + sum(kept) + casts + 2 * self.largest_after_blocks) / sp + whole
        end = (self.before_blocks + 2 * self.per_block_outputs[0]) / sp + grads  # block 0's backward done
        peaks, made = [head, end], grads - sum(block_grads)
        for k in reversed(range(blocks)):  # made: the gradients made before block k's backward
            own = self.per_block[k] + (self.per_block_inputs[k] + self._checkpoint_keeps(k)
                                       - self.per_block_own_inputs[k] + unsaved[k] if k < n else 0)
            before = self.before_blocks + sum(kept[:k])
            peaks.append((before + own + 2 * self.per_block_outputs[k]) / sp + (whole or made))
            made += block_grads[k]
        return int(max(peaks))


def count_activations(trainer, build, fake_mode, batch=None, engine_dtype=None):
    """Autograd's saved tensors of one trainer.forward_step, counted by storage (a tensor saved by several
    ops once; parameters and buffers not: they are counted as parameters) with the run's autocast dtype;
    with `engine_dtype` (DeepSpeed's bf16/fp16 engine) the model in that dtype, without autocast.

    With checkpointing of a block class (train.activation_class_names, else the classes repeated in a
    ModuleList), a block keeps only its inputs and recomputes its own saved tensors in backward, one block
    at a time: checkpointed = saved - sum(block saves) + block inputs and RNG states + the largest block save.
    What backward holds at once (with the gradients) is ActivationCount.backward_peak. Not counted: the
    kernels' own workspaces, gradient temporaries inside a block beyond the one flowing through it,
    allocator fragmentation.

    When train.dynamo_config compiles the blocks with inductor, each kind of block (class and input shapes)
    is traced again as compiled (compiled_saves.py) and its saves replace autograd's; a trace that fails
    leaves the eager count, said in `note` and one log line."""
    model = build(fake_mode)
    train = trainer.train_config
    fp8_note = _float8(model, trainer, fake_mode)
    if engine_dtype is not None:
        with fake_mode:
            _cast(model, engine_dtype)
    classes = list(parse_class_names(train.activation_class_names)) or repeated_block_classes(model)
    if batch is None:
        from .train_data import train_loaders
        batch = next(iter(as_stream(train_loaders(trainer, trainer.config.dataloaders.train)[0], torch.device("cpu"))))
    excluded = {_storage_key(t) for t in list(model.parameters()) + list(model.buffers())}
    seen, per_block, inputs, stack, in_blocks = {}, [], {}, [], set()
    first_block, order = {}, []  # input storage -> the block that first took it; each block's class
    saved_in, outside, outputs, block_params, params_seen = {}, [], [], [], set()
    trainable = {_storage_key(p) for p in model.parameters() if p.requires_grad}
    casts = {}  # autocast's cached casts of trainable parameters (held until autocast exits) -> (bytes, block)

    selective = {}  # outputs of the matmuls and attention in the blocks -> (bytes, block)
    calls = []  # each block's (module, args, kwargs, the storages of its tensor inputs)

    alive = []  # the tensors counted by storage, held to the end: a freed storage's address is not reused

    def on_cast(t):
        alive.append(t)
        casts.setdefault(_storage_key(t), (t.untyped_storage().nbytes(), stack[0] if stack else None))

    def on_selective(t):
        if stack:
            alive.append(t)
            selective.setdefault(_storage_key(t), (t.untyped_storage().nbytes(), stack[0]))

    def pack(t):
        key = _storage_key(t)
        if key not in excluded and key not in seen:
            seen[key] = t.untyped_storage().nbytes()
            if stack:
                per_block[stack[0]] += seen[key]
                in_blocks.add(key)
                saved_in[key] = stack[0]
            else:
                outside.append((seen[key], len(per_block)))  # with the number of blocks run so far
        return t

    def enter(module, args, kwargs):
        if not stack:
            per_block.append(0)
            order.append(type(module).__name__)
            own = [p for p in module.parameters() if p.requires_grad and id(p) not in params_seen]
            params_seen.update(id(p) for p in own)
            block_params.append(sum(p.numel() for p in own))
            calls.append((module, args, kwargs, [_storage_key(t) for t in tensor_leaves(args, kwargs)]))
            for t in _tensors((args, kwargs)):  # a buffer handed to each block (RoPE tables) is a buffer
                if _storage_key(t) not in excluded:
                    inputs.setdefault(_storage_key(t), t.untyped_storage().nbytes())
                    first_block.setdefault(_storage_key(t), len(per_block) - 1)
        stack.append(len(per_block) - 1)

    def leave(module, args, kwargs, output):
        stack.pop()
        if not stack:
            outputs.append(sum(t.numel() * t.element_size() for t in _tensors(output)))

    finished = []  # the model's own forward returned: a later failure (a .item() on the fake loss) ends nothing
    handles = [model.register_forward_hook(lambda *_: finished.append(True))]
    for module in model.modules():
        if type(module).__name__ in classes:
            handles.append(module.register_forward_pre_hook(enter, with_kwargs=True))
            handles.append(module.register_forward_hook(leave, with_kwargs=True))
    dtype = AUTOCAST_DTYPES.get(trainer.mixed_precision or "no") if engine_dtype is None else None
    autocast = _autocast(dtype)
    note = ""
    try:
        with fake_mode, autocast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                _WatchOps(trainable, on_cast, on_selective):
            trainer.forward_step(batch)
    except Exception as e:
        if not finished or stack:
            raise
        note = f"forward_step stopped after the model's forward ({type(e).__name__}): counted up to there"
    finally:
        for handle in handles:
            handle.remove()
    saved = sum(seen.values())
    # An input saved by an op outside the blocks stays in `saved` whether or not the blocks are checkpointed.
    kept = {key: size for key, size in inputs.items() if key not in seen or key in in_blocks}
    kept_inputs = sum(kept.values())
    per_block_inputs, own_inputs = [0] * len(per_block), [0] * len(per_block)
    for key, size in kept.items():
        per_block_inputs[first_block[key]] += size
        if saved_in.get(key) == first_block[key]:  # the block saves its input itself: held once in backward
            own_inputs[first_block[key]] += size
    # saves after the last block (the head's, the loss's) are freed before the blocks' backward begins
    before = sum(size for size, started in outside if started < len(per_block))
    after = max((size for size, started in outside if started == len(per_block)), default=0)
    block_casts, unsaved_casts = [0] * len(per_block), [0] * (len(per_block) + 1)  # the last: outside the blocks
    for key, (size, block) in casts.items():
        if block is not None:
            block_casts[block] += size
        if key not in seen:
            unsaved_casts[-1 if block is None else block] += size
    kept_selective, unsaved_selective = [0] * len(per_block), [0] * len(per_block)
    for key, (size, block) in selective.items():
        kept_selective[block] += size
        if key not in seen:
            unsaved_selective[block] += size
    # torch's checkpoint also keeps the CPU RNG state of each block (to replay its dropout): 5 KB each
    rng_one = torch.get_rng_state().numel()
    keeps, compiled = [rng_one] * len(per_block), False
    if per_block and traces_compiled(train):
        try:
            traced = _compiled_blocks(calls, excluded, fake_mode, lambda: _autocast(dtype), train,
                                      set(seen) - in_blocks, inputs, kept, first_block)
        except Exception as e:  # a block dynamo or AOTAutograd cannot trace on fake tensors
            first = str(e).splitlines()[0][:160] if str(e) else ""
            why = (f"the compiled blocks could not be traced ({type(e).__name__}: {first}): counted as eager"
                   " autograd saves them (above what inductor keeps)")
            log.warning("activation count: %s", why)
            note = "; ".join(n for n in (note, why) if n)
        else:
            saved = saved - sum(per_block) + sum(traced["per_block"])
            per_block, own_inputs, keeps = traced["per_block"], traced["own_inputs"], traced["keeps"]
            kept_selective, unsaved_selective = traced["selective"], [0] * len(per_block)
            block_casts = [0] * len(per_block)  # inside a compiled graph a cast is the graph's, not autocast's cache
            unsaved_casts = [0] * len(per_block) + unsaved_casts[-1:]
            compiled = True
    note = "; ".join(n for n in (note, fp8_note) if n)
    largest = max(per_block, default=0)
    checkpointed = saved - sum(per_block) + kept_inputs + sum(keeps) + largest if per_block else saved
    return ActivationCount(saved, checkpointed, classes, len(per_block), largest, kept_inputs + sum(keeps), note,
                           per_block, per_block_inputs, order, rng_one, before, outputs, own_inputs, block_params,
                           sum(p.numel() for p in model.parameters() if p.requires_grad), after, block_casts,
                           unsaved_casts, kept_selective, unsaved_selective, keeps if compiled else [], compiled)


def _compiled_blocks(calls, excluded, fake_mode, autocast, train, outside, input_sizes, kept, first_block):
    """Each block's saves as compiled (one trace per class and input shapes, plain and as the run checkpoints
    it): {"per_block": its saves (a saved input counted once, where first saved and not outside the blocks),
    "own_inputs": of the inputs it adds to those kept, what it saves too, "keeps": what it keeps besides its
    inputs when checkpointed, "selective": what "selective" keeps beyond that}."""
    wraps = [None, "checkpoint"] + (["selective"] if train.activation_checkpointing == "selective" else [])
    traced = {}
    for module, args, kwargs, _ in calls:
        kind = _call_kind(module, args, kwargs)
        if kind not in traced:
            with fake_mode, autocast():
                traced[kind] = {wrap: block_saves(module.forward, args, kwargs, excluded, wrap) for wrap in wraps}
    counted, result = set(), dict(per_block=[], own_inputs=[], keeps=[], selective=[])
    for k, (module, args, kwargs, keys) in enumerate(calls):
        saves = traced[_call_kind(module, args, kwargs)]
        plain = saves[None]
        saved_inputs = {keys[p] for p in plain.inputs} - excluded
        new = saved_inputs - outside - counted
        counted |= new
        result["per_block"].append(plain.intermediates + plain.rng + sum(input_sizes[key] for key in new))
        result["own_inputs"].append(sum(size for key, size in kept.items()
                                        if first_block[key] == k and key in saved_inputs))
        keep = saves["checkpoint"].intermediates + saves["checkpoint"].rng
        result["keeps"].append(keep)
        chosen = saves.get("selective")
        result["selective"].append(max(0, chosen.intermediates + chosen.rng - keep) if chosen else 0)
    return result


def _call_kind(module, args, kwargs):
    """A block's class, parameters and arguments (tensors by shape, dtype and whether they need a gradient):
    blocks of one kind compile to one graph."""
    leaves = [(tuple(t.shape), t.dtype, t.requires_grad) if torch.is_tensor(t) else repr(t)[:80]
              for t in torch.utils._pytree.tree_leaves((args, kwargs))]
    params = [(tuple(p.shape), p.dtype, p.requires_grad) for p in module.parameters()]
    return type(module), tuple(leaves), tuple(params)


def _autocast(dtype):
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _float8(model, trainer, fake_mode):
    """Under mixed_precision="fp8", the model's Linears swapped for torchao's float8 ones as the run swaps them
    (engine/fp8.py); without torchao a note that they are counted in bf16."""
    if trainer.mixed_precision != "fp8":
        return ""
    if importlib.util.find_spec("torchao") is None:
        return "fp8: torchao is not installed here, the Linears counted as bf16 ones"
    from ..engine.fp8 import convert_to_float8
    with fake_mode:
        convert_to_float8(model, trainer.train_config.fp8_config)
    return ""


class _WatchOps(TorchDispatchMode):
    """Calls `on_cast` with each copy of a parameter (autocast's casts: aten._to_copy of the parameter) and
    `on_selective` with each output of the ops selective checkpointing keeps."""

    def __init__(self, parameters, on_cast, on_selective):
        super().__init__()
        self.parameters, self.on_cast, self.on_selective = parameters, on_cast, on_selective

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and torch.is_tensor(out) and \
                _storage_key(args[0]) in self.parameters:
            self.on_cast(out)
        elif func in SELECTIVE_SAVED_OPS:
            for t in _tensors(out):
                self.on_selective(t)
        return out


def _cast(model, dtype):
    """module.to(dtype) for fake tensors (whose .to() cannot swap a Parameter in place): floating
    parameters and buffers replaced by cast ones, as DeepSpeed's engine casts the module."""
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_floating_point():
                module._parameters[name] = torch.nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
        for name, b in module._buffers.items():
            if b is not None and b.is_floating_point():
                module._buffers[name] = b.to(dtype)


def _storage_key(t):
    return t.untyped_storage()._cdata


def _tensors(value):
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
