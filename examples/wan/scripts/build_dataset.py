"""Build a Wan training folder of .safetensors samples (latents + text embeddings).

  Random samples of the right shapes (no weights needed):
    python examples/wan/scripts/build_dataset.py --synthetic 8 --out data/wan_synth [--frames 49 --height 480
        --width 832 | --latent-shape 48,13,30,52] [--text-shape 512,4096]
  Encoded clips (each image, image folder or video in DIR with a same-stem .txt caption), with the
  Wan VAE and UMT5 from a local diffusers folder (e.g. Wan2.2-TI2V-5B-Diffusers; never downloaded):
    python examples/wan/scripts/build_dataset.py --videos DIR --vae W --text-encoder W --out data/wan_t2v
        [--frames 49 --height 480 --width 832 --device cuda]

Exit 2 with one line on stderr for bad input (a missing weights folder, clips without captions);
nothing is written then."""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from examples.wan.model import (latent_shape, local_component, missing_weights_message,  # noqa: E402
                                offline_hub)


class BadInput(Exception):
    """Reported in one line, exit 2."""


def shape(text):
    return tuple(int(v) for v in text.split(","))


def parse_args(argv):
    p = argparse.ArgumentParser(prog="build_dataset.py", description=__doc__.split("\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--synthetic", type=int, metavar="N", help="write N random samples")
    source.add_argument("--videos", metavar="DIR", help="encode the clips in DIR")
    p.add_argument("--out", required=True, help="the dataset folder to write")
    p.add_argument("--frames", type=int, default=49, help="frames per clip (4k+1)")
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--latent-shape", type=shape, help="synthetic: C,F,H,W (default: from frames/height/width)")
    p.add_argument("--text-shape", type=shape, default=(512, 4096), help="synthetic: L,D")
    p.add_argument("--vae", help="local diffusers folder with vae/ (or the VAE folder itself)")
    p.add_argument("--text-encoder", help="local diffusers folder with text_encoder/ (or that folder)")
    p.add_argument("--tokenizer", help="default: tokenizer/ beside the text encoder")
    p.add_argument("--device", default="cuda" if _cuda() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _cuda():
    import torch
    return torch.cuda.is_available()


def build_synthetic(args):
    from examples.wan.samples import write_synthetic_dataset
    try:
        latents = args.latent_shape or latent_shape(args.frames, args.height, args.width)
    except ValueError as e:
        raise BadInput(str(e)) from None
    if len(latents) != 4 or len(args.text_shape) != 2:
        raise BadInput(f"--latent-shape needs C,F,H,W and --text-shape L,D, got {latents} and {args.text_shape}")
    paths = write_synthetic_dataset(args.out, args.synthetic, latents, args.text_shape, seed=args.seed,
                                    progress=True)
    print(f"wrote {len(paths)} synthetic samples (latents {list(latents)}, text_embeds"
          f" {list(args.text_shape)}) to {args.out}")


def resolve_encoder_folders(args):
    """(vae, text encoder, tokenizer) folders, or BadInput naming the first one missing."""
    if not args.vae or not args.text_encoder:
        raise BadInput("--videos needs --vae and --text-encoder (local diffusers folders)")
    vae = local_component(args.vae, "vae")
    if vae is None:
        raise BadInput(missing_weights_message("--vae", args.vae, "vae"))
    text_encoder = local_component(args.text_encoder, "text_encoder")
    if text_encoder is None:
        raise BadInput(missing_weights_message("--text-encoder", args.text_encoder, "text_encoder"))
    tokenizer_root = args.tokenizer or args.text_encoder
    tokenizer = (local_component(tokenizer_root, "tokenizer", "tokenizer_config.json")
                 or local_component(os.path.dirname(os.path.abspath(text_encoder)), "tokenizer",
                                    "tokenizer_config.json"))
    if tokenizer is None:
        raise BadInput(missing_weights_message("--tokenizer", tokenizer_root, "tokenizer"))
    return vae, text_encoder, tokenizer


def build_encoded(args):
    from tqdm import tqdm

    from examples.wan.samples import write_sample
    from examples.wan.encode import WanEncoders, find_clips, prepare_clip, read_frames
    folders = resolve_encoder_folders(args)  # before anything is read or written
    if not os.path.isdir(args.videos):
        raise BadInput(f"--videos: no folder at {args.videos}")
    clips, missing = find_clips(args.videos)
    if missing:
        raise BadInput(f"--videos: {len(missing)} clip(s) without a caption, first: {missing[0]}")
    if not clips:
        raise BadInput(f"--videos: no images, image folders or videos in {args.videos}")
    try:
        latent_shape(args.frames, args.height, args.width)
    except ValueError as e:
        raise BadInput(str(e)) from None
    offline_hub()
    encoders = WanEncoders(*folders, device=args.device)
    os.makedirs(args.out, exist_ok=True)
    for i, (path, caption) in enumerate(tqdm(clips, desc="encoding clips")):
        clip = prepare_clip(read_frames(path), args.frames, args.height, args.width)
        write_sample(os.path.join(args.out, f"sample_{i:06d}.safetensors"), encoders.encode_clip(clip),
                     encoders.encode_prompt(caption))
    print(f"wrote {len(clips)} encoded samples to {args.out}")


def main(argv=None):
    args = parse_args(argv)
    try:
        build_synthetic(args) if args.synthetic is not None else build_encoded(args)
    except BadInput as e:
        print(f"build_dataset: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
