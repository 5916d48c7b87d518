"""Compiled against eager gradients of the Wan2.2-5B transformer (random init, fewer layers), as giga-train
compiles it (each WanTransformerBlock in place, engine/compile.py) and with torch's inductor defaults, one
forward + backward under bf16 autocast per variant and token count. A variant fails when its total relative
gradient error exceeds the bf16 tolerance (1e-2) or a gradient is not finite. Prints a table; writes JSON.

    python3 bench/compile_check.py [--layers 4] [--shapes 480x832x49 1280x704x49 1280x704x121] [--out F]
"""
import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from examples.wan.model import WAN22_TI2V_5B, latent_shape  # noqa: E402
from giga_train.engine.compile import compile_model  # noqa: E402

TOLERANCE = 1e-2
VARIANTS = {"giga-train": dict(backend="inductor"),
            "inductor defaults": dict(backend="inductor", options={"triton.mix_order_reduction": True})}


def gradients(arch, shape, dynamo_config):
    from diffusers import WanTransformer3DModel
    torch.manual_seed(0)
    model = WanTransformer3DModel(**arch).cuda()
    if dynamo_config is not None:
        torch._dynamo.reset()
        compile_model(model, dynamo_config, classes=["WanTransformerBlock"])
    g = torch.Generator(device="cuda").manual_seed(1)
    x, target = (torch.randn(shape, device="cuda", generator=g) for _ in range(2))
    text = torch.randn(1, 512, arch["text_dim"], device="cuda", generator=g)
    with torch.autocast("cuda", torch.bfloat16):
        out = model(hidden_states=x, timestep=torch.tensor([700.0], device="cuda"), encoder_hidden_states=text,
                    return_dict=False)[0]
    loss = torch.nn.functional.mse_loss(out.float(), target)
    loss.backward()
    return loss.item(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--shapes", nargs="*", default=["480x832x49", "1280x704x49", "1280x704x121"],
                   help="HEIGHTxWIDTHxFRAMES of the video")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/compile_check.json"))
    args = p.parse_args()
    arch = dict(WAN22_TI2V_5B, num_layers=args.layers)
    rows = []
    for spec in args.shapes:
        height, width, frames = (int(v) for v in spec.split("x"))
        shape = (1, *latent_shape(frames, height, width))
        tokens = shape[2] * (shape[3] // 2) * (shape[4] // 2)
        eager_loss, eager = gradients(arch, shape, None)
        norm = sum(g.norm() ** 2 for g in eager.values()) ** 0.5
        rows.append(dict(shape=spec, tokens=tokens, variant="eager", loss=eager_loss, grad_norm=norm.item(),
                         rel_err=0.0, status="ok"))
        for name, config in VARIANTS.items():
            start = time.time()
            loss, got = gradients(arch, shape, config)
            err = (sum((got[k] - eager[k]).norm() ** 2 for k in eager) ** 0.5 / norm).item()
            finite = all(torch.isfinite(g).all().item() for g in got.values())
            rows.append(dict(shape=spec, tokens=tokens, variant=name, loss=loss, rel_err=err,
                             grad_norm=(sum(g.norm() ** 2 for g in got.values()) ** 0.5).item(),
                             status="ok" if finite and err <= TOLERANCE else "wrong gradients", seconds=time.time() - start))
            print(f"[compile_check] {spec} {name}: rel err {err:.2e}", file=sys.stderr, flush=True)
            del got
        del eager
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(torch=torch.__version__, card=torch.cuda.get_device_name(), layers=args.layers,
                       tolerance=TOLERANCE, rows=rows), f, indent=2)
    print(f"\nWan2.2-5B transformer, {args.layers} layers, random init, bf16 autocast; {torch.__version__}")
    print("| video | tokens | variant | loss | grad norm | rel. grad error vs eager | status |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['tokens']} | {r['variant']} | {r['loss']:.6f} | {r['grad_norm']:.4g} |"
              f" {r['rel_err']:.2e} | {r['status']} |")


if __name__ == "__main__":
    main()
