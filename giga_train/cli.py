"""giga-train train CONFIG [--set key=value ...] | check CONFIG [--set ...] | plan CONFIG [--set ...] [--gpus 1,8]
[--card h200] [--json] | convert CHECKPOINT --to full|dcp | export CHECKPOINT --to hf [--out DIR] [--ema]"""
import argparse
import sys

from .config import load_config
from .errors import CheckpointError, ConfigError, RankFailed, RegistryError, TrainingStopped


def main(argv=None):
    parser = argparse.ArgumentParser(prog="giga-train", description=__doc__.strip())
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("train", "run the config's training job"),
                            ("check", "validate the config and exit (nothing is run)")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("config", help="a .py/.yaml/.json file, or a dotted module path")
        sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="override a config value (a Python literal, else a string); repeatable")
    sub = commands.add_parser("plan", help="the memory per GPU of the config's job, per strategy and GPU count")
    sub.add_argument("config", help="a .py/.yaml/.json file, or a dotted module path")
    sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config value (a Python literal, else a string); repeatable")
    sub.add_argument("--gpus", default="1,8", help="GPU counts to plan for (default 1,8)")
    sub.add_argument("--card", default="h200", help="the GPU: h200, h100, a100 or a size such as 80GiB")
    sub.add_argument("--sp", default=None, help="sequence-parallel sizes for DDP and FSDP, e.g. 1,2,4,8"
                     " (default 1 and launch.parallelism_config's sp_size)")
    sub.add_argument("--json", action="store_true", help="print the plan as JSON")
    sub = commands.add_parser("convert", help="write a checkpoint's model and optimizer state as plain files")
    sub.add_argument("checkpoint", help="a checkpoint folder (models/checkpoint_epoch_E_step_S)")
    sub.add_argument("--to", required=True, choices=("full", "dcp"),
                     help="full: model.safetensors + optimizer.pt; dcp: one torch.distributed.checkpoint folder")
    sub.add_argument("--out", help="the folder to create (default: CHECKPOINT_full or CHECKPOINT_dcp)")
    sub = commands.add_parser("export", help="write a checkpoint's model as folders from_pretrained opens")
    sub.add_argument("checkpoint", help="a checkpoint folder (models/checkpoint_epoch_E_step_S)")
    sub.add_argument("--to", required=True, choices=("hf",), help="hf: transformers / diffusers / PEFT folders")
    sub.add_argument("--out", help="the folder to create (default: CHECKPOINT_hf, CHECKPOINT_ema_hf with --ema)")
    sub.add_argument("--ema", action="store_true", help="export the EMA weights (train.with_ema)")
    sub.add_argument("--config", help="the run's config (default: the config.json the run saved in its project)")
    sub.add_argument("--max-shard-size", default="5GB", help="larger models are sharded (default 5GB)")
    sub.add_argument("--merged", action="store_true", help="PEFT: also write the merged model (merged/)")
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            from .tools.plan import plan_command
            plan_command(args)
            return 0
        if args.command == "export":
            from .tools.export import export
            print(export(args.checkpoint, args.out, ema=args.ema, config=args.config,
                         max_shard_size=args.max_shard_size, merged=args.merged))
            return 0
        if args.command == "convert":
            from .tools.convert import convert
            print(convert(args.checkpoint, args.to, args.out))
            return 0
        if args.command == "check":
            from .launch.runners import validated_runners
            cfg = load_config(args.config, args.overrides)
            validated_runners(cfg)
            print(f"{args.config}: ok ({', '.join(cfg.runners)})")
            return 0
        from .launch.launcher import launch_from_config
        launch_from_config(args.config, overrides=args.overrides)
    except (ConfigError, RegistryError) as e:  # bad input: one line naming the key, file or value
        print(f"giga-train: error: {e}", file=sys.stderr)
        return 2
    except (TrainingStopped, CheckpointError, RankFailed) as e:
        # the NaN guard, a full disk, a refused or damaged file, a stuck rank; a rank's error (its own
        # traceback printed above): one line, exit 1
        print(f"giga-train: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("giga-train: interrupted", file=sys.stderr)
        return 130
    # Anything else (a ValueError in the user's model or dataset included) keeps its traceback: a bug
    # to find where it happened, not bad input.
    return 0


if __name__ == "__main__":
    sys.exit(main())
