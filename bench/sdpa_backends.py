"""SDPA's backends (torch's default choice, flash, cuDNN, efficient, math) forward + backward at the Wan2.2-5B attention shapes:
milliseconds per call and each backend's gradients against the math backend in fp32 (where that fits).

    python bench/sdpa_backends.py                   # CUDA: 24 heads x 128, bf16, 5,070 / 11,440 / 27,280 tokens
    python bench/sdpa_backends.py --device cpu --heads 2 --head-dim 16 --tokens 512

Layouts as diffusers' Wan passes them: (B, S, H, D) tensors permuted to (B, H, S, D). A backend that refuses
a shape is a row. The reference is the math backend on fp32 copies (skipped above --math-max-tokens: its
score matrix is H*S*S floats). Prints a table last and writes JSON (bench/sdpa_backends.json)."""
import argparse
import contextlib
import datetime
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def qkv(tokens, heads, dim, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(0)
    return [(torch.randn(1, tokens, heads, dim, generator=g) * s).to(device, dtype).permute(0, 2, 1, 3)
            .detach().requires_grad_() for s in (1.0, 1.0, 1.0)]


def fwd_bwd(q, k, v, grad):
    out = F.scaled_dot_product_attention(q, k, v)
    return out, torch.autograd.grad(out, (q, k, v), grad)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def measure(backend, tokens, args, reference):
    q, k, v = qkv(tokens, args.heads, args.head_dim, args.device, args.dtype)
    grad = torch.randn(q.shape, generator=torch.Generator(device="cpu").manual_seed(1)).to(args.device, args.dtype)
    with (contextlib.nullcontext() if BACKENDS[backend] is None else sdpa_kernel([BACKENDS[backend]])):
        out, grads = fwd_bwd(q, k, v, grad)  # warm-up (and the cuDNN plan)
        sync(args.device)
        start = time.perf_counter()
        for _ in range(args.repeats):
            fwd_bwd(q, k, v, grad)
        sync(args.device)
    ms = (time.perf_counter() - start) / args.repeats * 1e3
    flops = 3 * 4 * tokens * tokens * args.heads * args.head_dim  # fwd 2 matmuls, bwd 2x that
    row = dict(backend=backend, tokens=tokens, ms=ms, tflops=flops / ms / 1e9)
    if reference is not None:
        row["max_rel_err"] = max(((g.float() - r).norm() / r.norm()).item() for g, r in zip((out, *grads), reference))
        row["finite"] = all(torch.isfinite(g).all().item() for g in (out, *grads))
    return row


def fp32_reference(tokens, args):
    q, k, v = (t.detach().float().requires_grad_() for t in qkv(tokens, args.heads, args.head_dim, args.device, args.dtype))
    grad = torch.randn(q.shape, generator=torch.Generator(device="cpu").manual_seed(1)).to(args.device, args.dtype)
    with sdpa_kernel([SDPBackend.MATH]):
        out, grads = fwd_bwd(q, k, v, grad.float())
    return [t.detach() for t in (out, *grads)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--tokens", type=int, nargs="*", default=[5070, 11440, 27280])
    p.add_argument("--backends", nargs="*", default=list(BACKENDS), choices=list(BACKENDS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--math-max-tokens", type=int, default=12000, help="no fp32 reference (nor math row) above")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdpa_backends.json"))
    args = p.parse_args()
    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    rows = []
    for tokens in args.tokens:
        reference = fp32_reference(tokens, args) if tokens <= args.math_max_tokens else None
        for backend in args.backends:
            if backend == "math" and tokens > args.math_max_tokens:
                rows.append(dict(backend=backend, tokens=tokens, status="skipped (H*S*S scores)"))
                continue
            try:
                rows.append(dict(measure(backend, tokens, args, reference), status="ok"))
            except RuntimeError as error:  # "No available kernel", an OOM
                rows.append(dict(backend=backend, tokens=tokens, status=f"refused: {str(error).splitlines()[0][:160]}"))
            print(f"[sdpa_backends] {rows[-1]}", file=sys.stderr, flush=True)
            if args.device == "cuda":
                torch.cuda.empty_cache()
        del reference
    meta = dict(date=datetime.date.today().isoformat(), card=torch.cuda.get_device_name() if args.device == "cuda"
                else "cpu", torch=torch.__version__, cudnn=torch.backends.cudnn.version(), heads=args.heads,
                head_dim=args.head_dim, dtype=str(args.dtype), command=" ".join(["python", "bench/sdpa_backends.py",
                                                                                   *sys.argv[1:]]))
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=2)
    print(f"\n{meta['date']}, {meta['card']}, torch {meta['torch']}, cuDNN {meta['cudnn']}, {args.heads} heads x"
          f" {args.head_dim}, {args.dtype}, fwd+bwd")
    print("| tokens | backend | status | ms | TFLOP/s | max rel err vs fp32 math | finite |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ms = f"{r['ms']:.2f} | {r['tflops']:.0f}" if "ms" in r else " | "
        err = f"{r['max_rel_err']:.3g} | {r['finite']}" if "max_rel_err" in r else " | "
        print(f"| {r['tokens']} | {r['backend']} | {r['status']} | {ms} | {err} |")


if __name__ == "__main__":
    main()
