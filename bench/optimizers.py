"""Optimizer step time, state bytes/param and 8-bit trajectory drift, ours beside the anchors.

    python bench/optimizers.py                          # CUDA, the 308M set (6 Llama-like layers, d=2048)
    python bench/optimizers.py --device cpu --size tiny # a quick CPU run
    python bench/optimizers.py --sharded                # CAME8Bit under FSDP2 and ZeRO-2 at one rank
    python bench/optimizers.py --sharded --device cpu --size tiny   # its CPU smoke run

Anchors: torch AdamW (fused, foreach), came-pytorch CAME (fp32), GigaTrain's published CAME8Bit
re-created from its description (min-max codes in blocks of `block_size` *rows*, re-quantized in a
Python loop), bitsandbytes AdamW8bit when importable. Step time: CUDA events around >= 5 steps
after warm-up (wall clock on CPU). Drift: |theta_8bit - theta_fp32| / |theta_fp32 - theta_0| after
30 steps of heavy-tailed gradients (Student-t, df=2) whose rows differ 1000x in scale.
"""
import argparse
import functools
import gc
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from giga_train.optimizers import CAME8Bit, FusedAdam  # noqa: E402

SIZES = {"full": dict(layers=6, d=2048, ffn=5632), "tiny": dict(layers=2, d=64, ffn=176)}


def param_shapes(layers, d, ffn):
    """Llama-like blocks: q, k, v, o, gate, up, down and two norm weights each."""
    per_layer = [(d, d)] * 4 + [(ffn, d), (ffn, d), (d, ffn), (d,), (d,)]
    return per_layer * layers


class PublishedCAME8Bit(torch.optim.Optimizer):
    """The published GigaTrain/SANA CAME8Bit algorithm as described: came-pytorch's CAME, the first
    moment of tensors above min_8bit_size stored as uint8 min-max codes over blocks of
    `block_size` rows, dequantized and re-quantized every step in a Python loop over blocks."""

    def __init__(self, params, lr, betas=(0.9, 0.999, 0.9999), eps=(1e-30, 1e-16), clip_threshold=1.0,
                 weight_decay=0.0, block_size=2048, min_8bit_size=16384):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, clip_threshold=clip_threshold,
                                      weight_decay=weight_decay))
        self.block_size, self.min_8bit_size = block_size, min_8bit_size

    def _quantize(self, x, state):
        codes, lows, scales = state["exp_avg_q"], state["exp_avg_min"], state["exp_avg_scale"]
        for i, start in enumerate(range(0, x.shape[0], self.block_size)):
            block = x[start:start + self.block_size]
            lo, hi = block.min(), block.max()
            scale = (hi - lo).clamp(min=1e-30) / 255
            codes[start:start + self.block_size] = ((block - lo) / scale).round_().to(torch.uint8)
            lows[i], scales[i] = lo, scale

    def _dequantize(self, state):
        codes = state["exp_avg_q"]
        out = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
        for i, start in enumerate(range(0, codes.shape[0], self.block_size)):
            out[start:start + self.block_size] = (codes[start:start + self.block_size].float()
                                                  * state["exp_avg_scale"][i] + state["exp_avg_min"][i])
        return out

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2, b3 = group["betas"]
            eps1, eps2 = group["eps"]
            for p in group["params"]:
                g = p.grad.float()
                st = self.state[p]
                factored = g.dim() >= 2
                quant = factored and g.numel() > self.min_8bit_size
                if not st:
                    nb = -(-g.shape[0] // self.block_size)
                    if quant:
                        st["exp_avg_q"] = torch.zeros(g.shape, dtype=torch.uint8, device=g.device)
                        st["exp_avg_min"] = torch.zeros(nb, device=g.device)
                        st["exp_avg_scale"] = torch.zeros(nb, device=g.device)
                    else:
                        st["exp_avg"] = torch.zeros_like(g)
                    if factored:
                        for k in ("sq", "res"):
                            st[f"{k}_row"] = torch.zeros(g.shape[:-1], device=g.device)
                            st[f"{k}_col"] = torch.zeros(g.shape[:-2] + g.shape[-1:], device=g.device)
                    else:
                        st["exp_avg_sq"] = torch.zeros_like(g)
                upd = g * g + eps1
                if factored:
                    st["sq_row"].mul_(b2).add_(upd.mean(-1), alpha=1 - b2)
                    st["sq_col"].mul_(b2).add_(upd.mean(-2), alpha=1 - b2)
                    upd = approx_sq(st["sq_row"], st["sq_col"]).mul_(g)
                else:
                    st["exp_avg_sq"].mul_(b2).add_(upd, alpha=1 - b2)
                    upd = st["exp_avg_sq"].rsqrt().mul_(g)
                upd.div_((rms(upd) / group["clip_threshold"]).clamp_(min=1.0))
                m = self._dequantize(st) if quant else st["exp_avg"]
                m.mul_(b1).add_(upd, alpha=1 - b1)
                if factored:
                    res = (upd - m) ** 2 + eps2
                    st["res_row"].mul_(b3).add_(res.mean(-1), alpha=1 - b3)
                    st["res_col"].mul_(b3).add_(res.mean(-2), alpha=1 - b3)
                    upd = approx_sq(st["res_row"], st["res_col"]).mul_(m)
                else:
                    upd = m.clone()
                if quant:
                    self._quantize(m, st)
                if group["weight_decay"]:
                    p.add_(p, alpha=-group["weight_decay"] * group["lr"])
                p.add_(upd.to(p.dtype), alpha=-group["lr"])


def rms(t):
    return t.norm(2) / math.sqrt(t.numel())


def approx_sq(row, col):
    return (row / row.mean(-1, keepdim=True)).rsqrt_().unsqueeze(-1) * col.unsqueeze(-2).rsqrt()


def candidates(device):
    """name -> factory(params); anchors first, ours last. Unavailable ones are left out."""
    out = {}
    if device == "cuda":
        out["torch AdamW fused"] = lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=True)
    out["torch AdamW foreach"] = lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True)
    try:
        from came_pytorch import CAME
        out["came-pytorch CAME (fp32)"] = lambda ps: CAME(ps, lr=1e-4)
    except ImportError:
        pass
    out["published CAME8Bit (re-created)"] = lambda ps: PublishedCAME8Bit(ps, lr=1e-4)
    try:
        import bitsandbytes as bnb
        if device == "cuda":
            out["bitsandbytes AdamW8bit"] = lambda ps: bnb.optim.AdamW8bit(ps, lr=1e-4)
    except ImportError:
        pass
    out["giga FusedAdam"] = lambda ps: FusedAdam(ps, lr=1e-4)
    out["giga CAME8Bit"] = lambda ps: CAME8Bit(ps, lr=1e-4)
    if device == "cuda":
        out["giga CAME8Bit (torch path)"] = lambda ps: with_backend(CAME8Bit(ps, lr=1e-4), "torch")
    return out


def with_backend(opt, backend):
    opt.backend = backend
    return opt


def state_bytes(opt):
    """Bytes of optimizer state this rank holds (local shards; CAME8Bit's ZeRO pieces included)."""
    def count(d):
        total = 0
        for v in d.values():
            if isinstance(v, dict):
                total += count(v)
            elif torch.is_tensor(v):
                v = getattr(v, "_local_tensor", v)
                total += v.numel() * v.element_size()
        return total
    return sum(count(st) for st in opt.state.values())


def _one_rank_group(device):
    import torch.distributed as dist
    if not dist.is_initialized():
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=0, world_size=1)


def sharded_rows(device, shapes, warmup, steps, backend="auto"):
    """CAME8Bit step time and state bytes/param per rank at one rank: on whole tensors, on FSDP2's
    DTensor shards (fully_shard), and on ZeRO-2's flat fp32 partition (the layout DeepSpeed hands the
    optimizer: every weight a view of one flat tensor, came_zero.py), the same kernels throughout."""
    from giga_train.optimizers.came_zero import layouts_of
    _one_rank_group(device)
    kw = dict(lr=1e-4, weight_decay=0.01)
    gen = torch.Generator(device=device).manual_seed(0)
    init = [torch.randn(s, device=device, generator=gen) * 0.02 for s in shapes]
    grads = [torch.randn(s, device=device, generator=gen) * 1e-3 for s in shapes]
    numel = sum(t.numel() for t in init)
    rows = []

    def record(name, opt, fn):
        for _ in range(warmup):
            fn()
        ms = Timer(device)(fn, steps)
        rows.append(dict(name=name, step_ms=ms, state_bytes_per_param=state_bytes(opt) / numel, params=numel))
        print(f"{name}: {ms:.2f} ms, {rows[-1]['state_bytes_per_param']:.3f} B/param", flush=True)

    params = [torch.nn.Parameter(t.clone()) for t in init]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt = with_backend(CAME8Bit(params, **kw), backend)
    record("CAME8Bit whole tensors", opt, opt.step)
    del opt, params

    from torch.distributed.fsdp import fully_shard
    module = torch.nn.Module()
    module.ps = torch.nn.ParameterList([torch.nn.Parameter(t.clone()) for t in init])
    fully_shard(module)
    for p, g in zip(module.ps, grads):
        p.grad = torch.distributed.tensor.DTensor.from_local(g.clone(), p.device_mesh, p.placements)
    opt = with_backend(CAME8Bit(module.parameters(), **kw), backend)
    record("CAME8Bit FSDP2 (1 rank)", opt, opt.step)
    del opt, module

    flat = torch.nn.Parameter(torch.cat([t.reshape(-1) for t in init]))
    flat.grad = torch.cat([g.reshape(-1) for g in grads])
    entries, off = [], 0
    for k, t in enumerate(init):
        entries.append((f"w{k}", tuple(t.shape), off, 0, t.numel()))
        off += t.numel()
    opt = with_backend(CAME8Bit([flat], **kw), backend)
    opt._zero = layouts_of([(flat, None, entries)])
    opt._zero[id(flat)].flat = flat
    record("CAME8Bit ZeRO-2 layout (1 rank)", opt, opt.step)
    del opt, flat
    base = rows[0]["step_ms"]
    for r in rows:
        r["x_whole"] = r["step_ms"] / base
    return rows


class Timer:
    def __init__(self, device):
        self.cuda = device == "cuda"

    def __call__(self, fn, steps):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(steps):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / steps
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        return (time.perf_counter() - t0) * 1000 / steps


def bench_step(name, factory, shapes, device, warmup, steps):
    gen = torch.Generator(device=device).manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, device=device, generator=gen) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-3
    opt = factory(params)
    for _ in range(warmup):
        opt.step()
    ms = Timer(device)(opt.step, steps)
    numel = sum(p.numel() for p in params)
    row = dict(name=name, step_ms=ms, state_bytes_per_param=state_bytes(opt) / numel, params=numel)
    del opt, params
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def heavy_tailed_grads(shape, steps, device, seed=0):
    """Student-t (df=2) noise, rows scaled by a random permutation of logspace(0, 3)."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.logspace(0, 3, shape[0])[torch.randperm(shape[0], generator=gen)]
    t = torch.distributions.StudentT(torch.tensor(2.0))
    torch.manual_seed(seed)
    return [(t.sample(shape) * rows[:, None] * 1e-3).to(device) for _ in range(steps)]


def trajectory(factory, grads, device, seed=1):
    gen = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter((torch.randn(grads[0].shape, generator=gen) * 0.02).to(device))
    p0 = p.detach().clone()
    opt = factory([p])
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p0, p.detach()


def drift_table(device, shape, steps=30):
    """Drift of each 8-bit CAME against came-pytorch fp32 CAME, same lr and gradients."""
    try:
        from came_pytorch import CAME
    except ImportError:
        return {}
    grads = heavy_tailed_grads(shape, steps, device)
    p0, ref = trajectory(lambda ps: CAME(ps, lr=1e-3), grads, device)
    rows = {"published CAME8Bit (re-created)": lambda ps: PublishedCAME8Bit(ps, lr=1e-3),
            "giga CAME8Bit": lambda ps: CAME8Bit(ps, lr=1e-3),
            "giga CAME8Bit fp32 moment (min_8bit_size=inf)": lambda ps: CAME8Bit(ps, lr=1e-3, min_8bit_size=2 ** 62)}
    if device == "cuda":
        rows["giga CAME8Bit (torch path)"] = lambda ps: with_backend(CAME8Bit(ps, lr=1e-3), "torch")
    out = {}
    for name, factory in rows.items():
        _, p = trajectory(factory, grads, device)
        out[name] = ((p - ref).norm() / (ref - p0).norm()).item()
    return out


def kernel_agreement(device):
    """CUDA only: the fused kernels against the torch path / torch AdamW on a small model."""
    if device != "cuda":
        return {}
    shapes = [(512, 384), (384,), (1000, 96), (64, 64)]
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        runs = {}
        for backend in ("torch", "auto"):
            gen = torch.Generator(device=device).manual_seed(0)
            ps = [torch.nn.Parameter((torch.randn(s, device=device, generator=gen) * 0.05).to(dtype)) for s in shapes]
            p0 = [p.detach().float().clone() for p in ps]
            opt = with_backend(CAME8Bit(ps, lr=1e-2, weight_decay=0.1, block_size=256, min_8bit_size=4096), backend)
            g2 = torch.Generator(device=device).manual_seed(1)
            for _ in range(10):
                for p in ps:
                    p.grad = (torch.randn(p.shape, device=device, generator=g2) * 1e-3).to(dtype)
                opt.step()
            runs[backend] = (p0, [p.detach().float() for p in ps], opt.state[ps[0]]["exp_avg_codes"])
        (p0, pt, ct), (_, pk, ck) = runs["torch"], runs["auto"]
        rel = max(((a - b).norm() / (a - z).norm()).item() for a, b, z in zip(pt, pk, p0) if a.dim() == 2)
        results[f"CAME8Bit kernel vs torch path, {dtype}: max over 2-D weights |dtheta_k - dtheta_t|/|dtheta_t|"] = rel
        results[f"CAME8Bit kernel vs torch path, {dtype}: code mismatch fraction"] = (ct != ck).float().mean().item()
    gen = torch.Generator(device=device).manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(s, device=device, generator=gen)) for s in shapes]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    fused = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    opts = [torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1), FusedAdam(ours, lr=1e-2, weight_decay=0.1),
            torch.optim.AdamW(fused, lr=1e-2, weight_decay=0.1, fused=True)]
    for _ in range(10):
        for a, b, c in zip(ref, ours, fused):
            a.grad = torch.randn(a.shape, device=device)
            b.grad, c.grad = a.grad.clone(), a.grad.clone()
        for o in opts:
            o.step()
    results["FusedAdam vs torch AdamW (fp32, randn params), max abs diff"] = max(
        (a - b).abs().max().item() for a, b in zip(ref, ours))
    results["torch AdamW fused vs torch AdamW (same setting), max abs diff"] = max(
        (a - c).abs().max().item() for a, c in zip(ref, fused))
    return results


def graph_check(device, shapes, steps=5):
    """CUDA only: capture one step in a CUDA graph; `steps` replays must equal `steps` eager steps.
    Then time the replay."""
    if device != "cuda":
        return {}
    out = {}
    for name, factory in (("giga CAME8Bit", lambda ps: CAME8Bit(ps, lr=1e-4)),
                          ("giga FusedAdam", lambda ps: FusedAdam(ps, lr=1e-4))):
        runs = []
        for graphed in (False, True):
            gen = torch.Generator(device=device).manual_seed(0)
            ps = [torch.nn.Parameter(torch.randn(s, device=device, generator=gen) * 0.02) for s in shapes]
            for p in ps:
                p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-3
            opt = factory(ps)
            opt.step()  # state, buckets and compiled kernels exist before capture
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                opt.step()
            torch.cuda.current_stream().wait_stream(side)
            if graphed:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    opt.step()
                for _ in range(steps):
                    graph.replay()
            else:
                for _ in range(steps):
                    opt.step()
            torch.cuda.synchronize()
            runs.append([p.detach().clone() for p in ps])
        out[f"{name} graph replay vs eager, max abs diff after {steps + 2} steps"] = max(
            (a - b).abs().max().item() for a, b in zip(*runs))
        out[f"{name} graphed step ms"] = Timer(device)(graph.replay, 10)
        del runs, graph, opt, ps
        torch.cuda.empty_cache()
    return out


def kernel_times(factory, shapes, device, steps=5):
    """ms per step of each CUDA kernel of one optimizer's step (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    gen = torch.Generator(device=device).manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, device=device, generator=gen) * 0.02) for s in shapes]
    for p in ps:
        p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-3
    opt = factory(ps)
    for _ in range(3):
        opt.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            opt.step()
        torch.cuda.synchronize()
    out = {}
    for evt in prof.key_averages():
        t = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0)
        if t > 0:
            out[evt.key[:60]] = t / 1000 / steps
    del opt, ps
    torch.cuda.empty_cache()
    return out


def profile_kernels(device, shapes, steps=5):
    """CUDA only: time of each kernel of our optimizers' steps (torch.profiler), ms per step."""
    if device != "cuda":
        return {}
    out = {}
    for name, factory in (("CAME8Bit", lambda ps: CAME8Bit(ps, lr=1e-4)), ("FusedAdam", lambda ps: FusedAdam(ps, lr=1e-4))):
        for kernel, ms in kernel_times(factory, shapes, device, steps).items():
            out[f"{name} kernel {kernel} ms/step"] = ms
    out.update(register_report())
    return out


def copy_bandwidth(device, nbytes=2 << 30):
    """CUDA only: device-to-device copy rate in TB/s (bytes read + written), the bandwidth ceiling."""
    if device != "cuda":
        return {}
    src = torch.empty(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = Timer(device)(functools.partial(dst.copy_, src), 10)
    del src, dst
    torch.cuda.empty_cache()
    return {"device-to-device copy TB/s": 2 * nbytes / ms / 1e9}


def register_report():
    """Registers and spills of each compiled kernel variant (Triton's compiled-kernel metadata)."""
    from giga_train.optimizers.kernels import adam_triton, came_triton
    out = {}
    for module in (came_triton, adam_triton):
        for name in dir(module):
            fn = getattr(module, name)
            for cache in getattr(fn, "device_caches", {}).values():
                kernels = cache[0] if isinstance(cache, tuple) else cache
                for i, kernel in enumerate(kernels.values()):
                    try:
                        kernel._init_handles()
                    except Exception:
                        pass
                    regs, spills = getattr(kernel, "n_regs", None), getattr(kernel, "n_spills", None)
                    warps = getattr(getattr(kernel, "metadata", None), "num_warps", None)
                    if regs is not None:
                        out[f"regs {name}[{i}] warps={warps}: regs"] = regs
                        out[f"regs {name}[{i}] warps={warps}: spills"] = spills
    return out


CAME_KNOBS = ("BR", "BC", "RC", "REDUCE_WARPS", "PREFETCH_REDUCE", "UPDATE_WARPS", "UPDATE_NB", "PREFETCH_UPDATE")
CAME_CONFIGS = [(8, 128, 512, 4, True, 8, 8, True), (8, 128, 512, 4, False, 8, 1, False),
                (8, 128, 256, 4, True, 8, 8, True), (8, 128, 1024, 4, True, 8, 8, True),
                (8, 128, 512, 4, True, 8, 4, True), (8, 128, 512, 4, True, 8, 16, True),
                (8, 128, 512, 8, True, 8, 8, True)]
ADAM_CONFIGS = [(1024, 4), (2048, 8)]
BIG_KERNELS = ("_sq_sums", "_res_sums", "_update")


def tune(device, shapes, warmup, steps):
    """Time our kernels under a few launch configurations (module constants of came_bucket and
    adam_triton), with each big kernel's share, and keep the fastest for the rest of the run."""
    from giga_train.optimizers.kernels import adam_triton, came_bucket
    timings = {}
    for config in CAME_CONFIGS:
        for n, v in zip(CAME_KNOBS, config):
            setattr(came_bucket, n, v)
        factory = lambda ps: CAME8Bit(ps, lr=1e-4)  # noqa: E731
        try:
            ms = bench_step("CAME8Bit", factory, shapes, device, warmup, steps)["step_ms"]
            kernels = kernel_times(factory, shapes, device, 3) if device == "cuda" else {}
        except Exception as e:  # a configuration the compiler refuses is reported, not fatal
            print(f"tune CAME8Bit {dict(zip(CAME_KNOBS, config))}: failed: {str(e)[:300]}", flush=True)
            continue
        timings[config] = ms
        parts = {b: sum(v for k, v in kernels.items() if b + "_kernel" in k) for b in BIG_KERNELS}
        rest = sum(kernels.values()) - sum(parts.values())
        print(f"tune CAME8Bit {dict(zip(CAME_KNOBS, config))}: {ms:.3f} ms; "
              + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()) + f", rest {rest:.3f}", flush=True)
    best = min(timings, key=timings.get)
    for n, v in zip(CAME_KNOBS, best):
        setattr(came_bucket, n, v)
    adam = {}
    for block, warps in ADAM_CONFIGS:
        adam_triton.BLOCK, adam_triton.WARPS = block, warps
        adam[(block, warps)] = bench_step("FusedAdam", lambda ps: FusedAdam(ps, lr=1e-4), shapes, device,
                                          warmup, steps)["step_ms"]
        print(f"tune FusedAdam BLOCK={block} warps={warps}: {adam[(block, warps)]:.3f} ms", flush=True)
    adam_triton.BLOCK, adam_triton.WARPS = min(adam, key=adam.get)
    chosen = {**dict(zip(CAME_KNOBS, best)), "ADAM_BLOCK": adam_triton.BLOCK, "ADAM_WARPS": adam_triton.WARPS}
    print(f"tune: measuring with {chosen}", flush=True)
    return chosen


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--drift-shape", default="4096,1024")
    ap.add_argument("--profile", action="store_true", help="also time each kernel (torch.profiler)")
    ap.add_argument("--tune", action="store_true",
                    help="first time a few kernel launch configurations, then measure with the fastest")
    ap.add_argument("--only", default="", help="comma-separated substrings of optimizer names to run")
    ap.add_argument("--sharded", action="store_true",
                    help="only CAME8Bit under FSDP2 and ZeRO-2 at one rank against whole tensors")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "optimizers.json"))
    args = ap.parse_args()
    shapes = param_shapes(**SIZES[args.size])
    device = args.device
    if args.sharded:
        rows = sharded_rows(device, shapes, args.warmup, max(args.steps, 5))
        card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
        out = args.out.replace("optimizers.json", "optimizers_sharded.json")
        with open(out, "w") as f:
            json.dump(dict(device=device, card=card, torch=torch.__version__, size=args.size, rows=rows), f, indent=2)
        print(f"\n{card}, torch {torch.__version__}, {rows[0]['params'] / 1e6:.1f}M params, {len(shapes)} tensors")
        print("\n| CAME8Bit | step ms | x whole tensors | state B/param per rank |")
        print("|---|---|---|---|")
        for r in rows:
            print(f"| {r['name']} | {r['step_ms']:.2f} | {r['x_whole']:.2f} | {r['state_bytes_per_param']:.3f} |")
        return
    chosen = tune(device, shapes, args.warmup, max(args.steps, 5)) if args.tune else {}
    rows = []
    for name, factory in candidates(device).items():
        if args.only and not any(s.strip() in name for s in args.only.split(",")):
            continue
        row = bench_step(name, factory, shapes, device, args.warmup, max(args.steps, 5))
        print(f"{name}: {row['step_ms']:.2f} ms, {row['state_bytes_per_param']:.3f} B/param", flush=True)
        rows.append(row)
    drift_shape = tuple(int(x) for x in args.drift_shape.split(",")) if args.size == "full" else (512, 64)
    drift = drift_table(device, drift_shape)
    extra = {**copy_bandwidth(device), **kernel_agreement(device), **graph_check(device, shapes)}
    if args.profile:
        extra.update(profile_kernels(device, shapes))
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    result = dict(device=device, card=card, torch=torch.__version__, size=args.size, shapes=len(shapes),
                  params=rows[0]["params"] if rows else 0, steps=rows, drift=drift,
                  drift_shape=list(drift_shape), checks=extra, launch_config=chosen)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    fused = next((r["step_ms"] for r in rows if r["name"] == "torch AdamW fused"), None)
    print(f"\n{card}, torch {torch.__version__}, {result['params'] / 1e6:.1f}M params, {len(shapes)} tensors"
          + (f", launch config {chosen}" if chosen else ""))
    for k, v in {**drift, **extra}.items():
        print(f"  {k}: {v:.4g}")
    print("\n| optimizer | step ms | x fused AdamW | state B/param | drift vs fp32 CAME |")
    print("|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['step_ms'] / fused:.2f}" if fused else "-"
        d = drift.get(r["name"])
        print(f"| {r['name']} | {r['step_ms']:.2f} | {ratio} | {r['state_bytes_per_param']:.3f} | "
              f"{'-' if d is None else f'{d:.3f}'} |")


if __name__ == "__main__":
    main()
