"""Run a function on N gloo ranks (spawned processes) with the whole world as the sequence-parallel group;
rank 0's return value comes back to the test."""
import os
import socket
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, out_path, fn, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    code = 0
    try:
        from giga_train.engine import sequence_parallel as sp
        sp.set_sequence_group(dist.group.WORLD)
        result = fn(*args)
        if rank == 0:
            torch.save(result, out_path)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        dist.destroy_process_group()
    os._exit(code)  # gloo threads can abort the interpreter's shutdown (SIGABRT after all work is done)


def run_ranks(world, fn, *args, tmp_path, timeout=120):
    out = str(tmp_path / f"result-{fn.__name__}-{world}.pt")
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, out, fn, args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0] * world, codes
    return torch.load(out, weights_only=False)


def summed_grad(t):
    """The gradient of a full (unsharded) leaf summed over the ranks: each rank holds its slice's part."""
    g = t.grad.clone()
    dist.all_reduce(g)
    return g
