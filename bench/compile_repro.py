"""Eager against compiled gradients of one Wan2.2-5B block (the 5B architecture with num_layers=1, random
init) at the token counts where regional compile went wrong, each variant beside eager in one run.

    python bench/compile_repro.py                          # CUDA: 5,070 / 11,440 / 27,280 tokens
    python bench/compile_repro.py --tiny --device cpu      # the same code paths on a tiny Wan (CPU, minutes)

The model runs as the trainer runs it: fp32 parameters under bf16 autocast (fp32 on CPU), a flow-matching
style MSE loss on the whole (one-block) transformer, one backward. Variants (--variants):
  eager            the reference (SDPA picks its backend)
  eager-flash, eager-efficient, eager-cudnn, eager-math   eager with SDPA forced to one backend
  inductor-in      blocks.0 compiled by inductor with SDPA inside the graph (what failed)
  inductor-out     the same with SDPA kept out of the graph (giga-train's default for diffusers models)
  aot-in           backend="aot_eager", SDPA inside (the graph capture without inductor's code)
  inductor-in-flash, inductor-in-cudnn, inductor-in-efficient   inductor-in with SDPA forced to one backend
A variant agrees with eager when every parameter's ||g - g_eager|| / ||g_eager|| is below --tolerance
(bf16: 0.05). Each compiled variant compiles afresh (torch._dynamo.reset, static shapes). Warnings raised
during a variant are counted by message (the layer_norm dtype warning was seen only in compiled runs).
Prints one line per variant as it finishes, a table last, and writes JSON (bench/compile_repro.json)."""
import argparse
import contextlib
import datetime
import json
import os
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

# (label, latent frames, latent height, latent width): 480x832x49, 1280x704x49, 480x832x121, 1280x704x121
SHAPES = {"480x832x49": (13, 30, 52), "1280x704x49": (13, 44, 80), "480x832x121": (31, 30, 52),
          "1280x704x121": (31, 44, 80)}
TINY_SHAPES = {"tiny-512": (2, 32, 32), "tiny-3840": (4, 48, 80)}
DEFAULT_VARIANTS = ("eager", "eager-flash", "eager-cudnn", "eager-efficient", "inductor-in", "inductor-out",
                    "aot-in")  # add inductor-in-flash / inductor-in-cudnn where inductor-in differs
TINY_ARCH = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                 text_dim=32, freq_dim=16, ffn_dim=64, num_layers=1, cross_attn_norm=True,
                 qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=128)


def sdpa_backend(name):
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]


def forced_backend(variant):
    """The SDPA backend a variant forces (None: SDPA's own choice)."""
    last = variant.rsplit("-", 1)[-1]
    return last if last in ("flash", "efficient", "cudnn", "math") else None


def build(arch, device, state=None):
    from diffusers import WanTransformer3DModel
    torch.manual_seed(0)
    with torch.device(device):
        model = WanTransformer3DModel(**arch)
    if state is not None:
        model.load_state_dict(state)
    return model


def inputs(arch, latent, device, text_len):
    g = torch.Generator(device="cpu").manual_seed(1)
    shape = (1, arch["in_channels"], *latent)
    return dict(latents=torch.randn(shape, generator=g).to(device), target=torch.randn(shape, generator=g).to(device),
                text=torch.randn(1, text_len, arch["text_dim"], generator=g).to(device))


def gradients(model, batch, device):
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    with autocast:
        out = model(hidden_states=batch["latents"], timestep=torch.tensor([500.0], device=device),
                    encoder_hidden_states=batch["text"], return_dict=False)[0]
    loss = torch.nn.functional.mse_loss(out.float(), batch["target"])
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def prepare(model, variant):
    """Compile blocks.0 as the variant says (nothing for eager ones)."""
    from giga_train.engine.compile import compile_model, put_attention_back_in_graph
    put_attention_back_in_graph()
    torch._dynamo.reset()
    if variant.startswith("eager"):
        return
    backend = "aot_eager" if variant.startswith("aot") else "inductor"
    compile_model(model, dict(backend=backend, dynamic=False, compile_attention="-in" in variant), ["WanTransformerBlock"])


def run_variant(variant, arch, state, batch, device):
    model = build(arch, device, state)
    prepare(model, variant)
    forced = forced_backend(variant)
    if forced:
        from torch.nn.attention import sdpa_kernel
        context = sdpa_kernel([sdpa_backend(forced)])
    else:
        context = contextlib.nullcontext()
    with warnings.catch_warnings(record=True) as caught, context:
        warnings.simplefilter("always")
        start = time.perf_counter()
        loss, grads = gradients(model, batch, device)  # first call: compile + run
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    messages = {}
    for w in caught:
        line = str(w.message).strip().splitlines()[0][:160]
        if "deprecated" not in line:
            messages[line] = messages.get(line, 0) + 1
    del model
    return loss, grads, seconds, messages


def compare(grads, reference):
    worst, worst_name, nonfinite = 0.0, None, 0
    for name, want in reference.items():
        got = grads.get(name)
        if got is None:
            continue
        if not torch.isfinite(got).all():
            nonfinite += 1
            continue
        err = ((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-30)).item()
        if err > worst:
            worst, worst_name = err, name
    return worst, worst_name, nonfinite


def total_norm(grads):
    return torch.stack([g.float().norm() for g in grads.values()]).norm().item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--shapes", nargs="*", help=f"labels among {', '.join(SHAPES)} (default: all but 480x832x121)")
    p.add_argument("--variants", nargs="*", default=list(DEFAULT_VARIANTS))
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--budget-s", type=float, default=300, help="variants not started by then are skipped")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/compile_repro.json"))
    args = p.parse_args()
    from examples.wan.model import WAN22_TI2V_5B
    arch = TINY_ARCH if args.tiny else dict(WAN22_TI2V_5B, num_layers=1)
    table = TINY_SHAPES if args.tiny else SHAPES
    labels = args.shapes or [s for s in table if s != "480x832x121"]
    text_len = 16 if args.tiny else 512
    if "eager" not in args.variants:
        args.variants.insert(0, "eager")
    deadline = time.monotonic() + args.budget_s
    state = {k: v.cpu() for k, v in build(arch, args.device).state_dict().items()}
    heads = arch["num_attention_heads"]
    rows = []
    for label in labels:
        latent = table[label]
        tokens = latent[0] * (latent[1] // 2) * (latent[2] // 2)
        batch = inputs(arch, latent, args.device, text_len)
        reference = None
        for variant in ["eager"] + [v for v in args.variants if v != "eager"]:
            row = dict(shape=label, tokens=tokens, heads_x_s_x_s=heads * tokens * tokens, variant=variant)
            if time.monotonic() > deadline:
                rows.append(dict(row, status="skipped (time budget)"))
                continue
            try:
                loss, grads, seconds, messages = run_variant(variant, arch, state, batch, args.device)
            except Exception as error:  # a backend that refuses the shape, an OOM: a row
                rows.append(dict(row, status=f"error: {type(error).__name__}: {str(error).splitlines()[0][:200]}"))
                print(f"[compile_repro] {label} {variant}: {rows[-1]['status']}", file=sys.stderr, flush=True)
                if args.device == "cuda":
                    torch.cuda.empty_cache()
                continue
            if variant == "eager":
                reference = grads
            worst, worst_name, nonfinite = compare(grads, reference)
            agrees = nonfinite == 0 and worst <= args.tolerance
            rows.append(dict(row, status="agrees" if agrees else "DIFFERS", loss=loss, grad_norm=total_norm(grads),
                             max_rel_err=worst, worst_param=worst_name, nonfinite_params=nonfinite,
                             first_call_s=seconds, warnings=messages))
            print(f"[compile_repro] {label} ({tokens} tokens) {variant}: {rows[-1]['status']}, loss {loss:.4f},"
                  f" grad norm {rows[-1]['grad_norm']:.4g}, max rel err {worst:.3g} ({worst_name}),"
                  f" non-finite {nonfinite}, {seconds:.1f} s" + (f", warnings {messages}" if messages else ""),
                  file=sys.stderr, flush=True)
            del grads
            if args.device == "cuda":
                torch.cuda.empty_cache()
    report(rows, args)


def report(rows, args):
    import diffusers
    meta = dict(date=datetime.date.today().isoformat(),
                card=torch.cuda.get_device_name() if args.device == "cuda" else "cpu", torch=torch.__version__,
                cudnn=torch.backends.cudnn.version() if args.device == "cuda" else None,
                diffusers=diffusers.__version__, tolerance=args.tolerance,
                command=" ".join(["python", "bench/compile_repro.py", *sys.argv[1:]]))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=2)
    print(f"\n{meta['date']}, {meta['card']}, torch {meta['torch']}, cuDNN {meta['cudnn']}, diffusers"
          f" {meta['diffusers']}; one Wan block, grads against eager (tolerance {args.tolerance})")
    print("| shape | tokens | H*S*S | variant | status | grad norm | max rel err | non-finite params | first call s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "grad_norm" in r:
            print(f"| {r['shape']} | {r['tokens']} | {r['heads_x_s_x_s']:.2e} | {r['variant']} | {r['status']} |"
                  f" {r['grad_norm']:.4g} | {r['max_rel_err']:.3g} | {r['nonfinite_params']} | {r['first_call_s']:.1f} |")
        else:
            print(f"| {r['shape']} | {r['tokens']} | {r['heads_x_s_x_s']:.2e} | {r['variant']} |"
                  f" {r['status'].replace('|', '/')} | | | | |")


if __name__ == "__main__":
    main()
