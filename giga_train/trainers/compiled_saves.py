"""What a block compiled by inductor keeps for backward: the block traced once on fake tensors through dynamo
and AOTAutograd with inductor's own decompositions and partitioner (its min-cut recomputation, which saves
less than eager autograd), no code generated; the bytes of the forward graph's saved outputs. Traced plain,
under activation checkpointing and under selective checkpointing, wrapped as the run wraps its blocks."""
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from ..engine.activation_checkpointing import checkpointed_call
from ..engine.compile import compiles

RNG_DTYPE = torch.uint8  # torch.get_rng_state()'s: what checkpoint keeps to replay a block's randomness


@dataclass
class BlockSaves:
    intermediates: int = 0  # bytes of the saved tensors that are neither inputs nor parameters (nor RNG states)
    inputs: frozenset = frozenset()  # positions, among the block's tensor inputs, of those it saves
    rng: int = 0            # bytes of the RNG states it saves


def traces_compiled(train):
    """Whether train.dynamo_config compiles the blocks with inductor (the partitioner this module mirrors)."""
    config = train.get("dynamo_config") or {}
    backend = config.get("backend", "inductor")
    return compiles(config) and isinstance(backend, str) and backend.lower() == "inductor"


def tensor_leaves(args, kwargs):
    """The tensors among a call's arguments, in pytree order (the positions BlockSaves.inputs names)."""
    return [leaf for leaf in pytree.tree_leaves((args, kwargs)) if torch.is_tensor(leaf)]


def block_saves(forward, args, kwargs, excluded, wrap=None):
    """BlockSaves of `forward(*args, **kwargs)` compiled as inductor would, `wrap` None, "checkpoint" or
    "selective"; `excluded`: the storages of the parameters and buffers (held as weights, not counted).
    Runs under the caller's FakeTensorMode and autocast. Raises when dynamo hands no graph over."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    where = [i for i, leaf in enumerate(leaves) if torch.is_tensor(leaf)]
    inputs = [_fresh_input(leaves[i]) for i in where]
    call = checkpointed_call(forward, selective=wrap == "selective") if wrap else forward

    def run(*tensors):
        flat = list(leaves)
        for i, t in zip(where, tensors):
            flat[i] = t
        call_args, call_kwargs = pytree.tree_unflatten(flat, spec)
        return call(*call_args, **call_kwargs)

    positions = {_storage_key(t): k for k, t in enumerate(inputs)}
    found = []
    compiled = torch.compile(run, backend=_recording_backend(found, positions, excluded), dynamic=False)
    try:
        compiled(*inputs)
    finally:
        torch._dynamo.reset_code(run.__code__)  # each trace compiles anew: no recompile limit reached
    if not found:
        raise RuntimeError("dynamo compiled no graph of the block")
    return BlockSaves(sum(s.intermediates for s in found), frozenset().union(*(s.inputs for s in found)),
                      sum(s.rng for s in found))


def _fresh_input(t):
    """The tensor cut from the graph that made it (same storage), needing a gradient where it did."""
    if t.is_floating_point() or t.is_complex():
        return t.detach().requires_grad_(t.requires_grad)
    return t.detach()


def _recording_backend(found, positions, excluded):
    """A dynamo backend: AOTAutograd with inductor's decompositions and partition function, each forward
    graph's saved values appended to `found` as BlockSaves; the graphs run as traced (no code generated)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.virtualized import V

    def backend(gm, example_inputs):
        def partition(joint, joint_inputs, **kwargs):
            forward, backward = partition_fn(joint, joint_inputs, **kwargs)
            found.append(_saved(forward, kwargs["num_fwd_outputs"], example_inputs, positions, excluded))
            return forward, backward
        with V.set_fake_mode(detect_fake_mode(example_inputs)):
            return aot_autograd(fw_compiler=_as_traced, bw_compiler=_as_traced, partition_fn=partition,
                                decompositions=select_decomp_table(), keep_inference_input_mutations=True)(
                gm, example_inputs)
    return backend


def _as_traced(gm, example_inputs):
    return gm


def _saved(forward, outputs, example_inputs, positions, excluded):
    """BlockSaves of one forward graph: its outputs past the first `outputs` are what backward reads. A saved
    graph input (or a view of one) is the block's input or a parameter (the forward graph's placeholder i is
    the dynamo graph's input i)."""
    graph_inputs = {}  # the storage of each graph input's traced value -> the tensor dynamo was handed
    for index, node in enumerate(forward.graph.find_nodes(op="placeholder")):
        value = node.meta.get("val")
        if torch.is_tensor(value) and index < len(example_inputs) and torch.is_tensor(example_inputs[index]):
            graph_inputs[_storage_key(value)] = example_inputs[index]
    saved = forward.graph.find_nodes(op="output")[0].args[0][outputs:]
    result, storages = BlockSaves(), set()
    inputs = set()
    for node in saved:
        value = node.meta.get("val")
        if not torch.is_tensor(value):
            continue  # a saved size
        original = graph_inputs.get(_storage_key(value))  # a graph input or a view of one (a RoPE slice)
        if original is not None:
            key = _storage_key(original)
            if key in excluded:
                continue
            if key in positions:
                inputs.add(positions[key])
                continue
        key = _storage_key(value)
        if key in storages:
            continue  # a view of a tensor saved already
        storages.add(key)
        size = _nbytes(value)
        if value.dtype == RNG_DTYPE and value.dim() == 1 and not isinstance(value.shape[0], int):
            result.rng += size
        else:
            result.intermediates += size
    result.inputs = frozenset(inputs)
    return result


def _nbytes(t):
    """Bytes of a traced tensor's storage; a size known only symbolically (the RNG state's) by its hint, else
    the CPU RNG state's length."""
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:
        pass
    numel = 1
    for s in t.shape:
        numel *= s if isinstance(s, int) else (s.node.hint if s.node.hint is not None else
                                                 torch.get_rng_state().numel())
    return int(numel * t.element_size())


def _storage_key(t):
    return t.untyped_storage()._cdata
