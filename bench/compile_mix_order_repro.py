"""A minimal reproduction of wrong gradients from inductor's mix-order reduction (CUDA, torch 2.10+):
the adaptive-norm modulation of a diffusion transformer block, y = layer_norm(x) * (1 + scale) + shift with
scale/shift broadcast over the tokens. The backward reduces over the tokens (scale/shift's gradients) and
over the features (layer norm's) and inductor fuses both into one mix-order kernel. Prints, per token count,
the relative error of the compiled gradients against eager, with mix-order reduction on (torch's default) and
off (what giga-train compiles with).

    python3 bench/compile_mix_order_repro.py [--tokens 5070,11440,27280] [--dim 3072]
"""
import argparse

import torch
import torch.nn.functional as F


def modulated_norm(x, table, temb, proj):
    shift, scale = (table + temb.float()).chunk(2, dim=1)
    y = F.layer_norm(x.float(), x.shape[-1:], eps=1e-6) * (1 + scale) + shift
    return (y.to(x.dtype).float() * proj).mean()


def grads(tokens, dim, compiled, mix_order):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, tokens, dim, device="cuda", generator=g).to(torch.bfloat16)
    temb = torch.randn(1, 2, dim, device="cuda", generator=g)
    proj = torch.randn(1, tokens, dim, device="cuda", generator=g)
    table = (torch.randn(1, 2, dim, device="cuda", generator=g) / dim ** 0.5).requires_grad_()
    fn = modulated_norm
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(modulated_norm, options={"triton.mix_order_reduction": mix_order})
    fn(x, table, temb, proj).backward()
    return table.grad


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="5070,11440,27280")
    p.add_argument("--dim", type=int, default=3072)
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for tokens in (int(t) for t in args.tokens.split(",")):
        eager = grads(tokens, args.dim, False, None)
        row = [f"tokens {tokens:>6}"]
        for mix in (True, False):
            err = ((grads(tokens, args.dim, True, mix) - eager).norm() / eager.norm()).item()
            row.append(f"mix_order_reduction={mix}: rel err {err:.1e}")
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
