"""`giga-train plan CONFIG [--set k=v] [--gpus 1,8] [--card h200|80GiB] [--json]`: the memory one GPU needs
for the config's job, per strategy, GPU count and sequence-parallel size (--sp), before anything is launched.
What each column counts, per engine: docs/guide.md, "How plan counts"."""
import json

from ..engine.deepspeed_config import read_deepspeed_config
from ..errors import ConfigError
from ..engine.precision import AUTOCAST_DTYPES

CARDS = {"h200": 150_109_880_320, "h100": 85_045_231_616, "a100": 85_045_231_616}  # total_memory as torch reports
FIT_FRACTION = 0.88
STRATEGIES = ("NO", "DDP", "FSDP", "ZERO0", "ZERO1", "ZERO2", "ZERO3")
DEEPSPEED_DEFAULTS = dict(reduce_bucket_size=5e8, stage3_max_live_parameters=1e9)  # DeepSpeed's own


def parse_card(card):
    """Bytes of a card: a name (h200, h100, a100) or a size such as 80GiB, 141GB."""
    name = str(card).strip().lower()
    if name in CARDS:
        return CARDS[name]
    for unit, scale in (("gib", 2**30), ("gb", 1e9), ("g", 2**30)):
        if name.endswith(unit):
            try:
                return int(float(name[:-len(unit)]) * scale)
            except ValueError:
                break
    raise ConfigError(f"--card: '{card}' is neither a known card ({', '.join(CARDS)}) nor a size like 80GiB")


def parse_gpus(gpus):
    try:
        counts = [int(g) for g in str(gpus).split(",") if g.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ConfigError(f"--gpus: '{gpus}' is not a list of GPU counts like 1,8")
    return counts


def per_gpu(strategy, gpus, params, optimizer_bytes, mixed, ds_zero=None, shard=None):
    """{"params", "grads", "optimizer", "master", "buffers"} bytes on one GPU (see the module docstring).
    `shard`: the ranks FSDP shards over (HSDP: gpus / dp_replicate_size; default all)."""
    n, nt, N = params.numel, params.trainable_numel, gpus
    c = 2 if mixed else 4
    if strategy in ("NO", "DDP"):
        if strategy == "NO" and N > 1:
            return None
        buckets = params.trainable_bytes if strategy == "DDP" and N > 1 else 0
        return dict(params=params.bytes, grads=params.trainable_bytes, optimizer=optimizer_bytes, master=0,
                    buffers=buckets)
    if strategy == "FSDP":
        N = shard or N
        gathered = (params.root_numel + 2 * max(params.units, default=0)) * c if N > 1 else 0
        return dict(params=params.bytes / N, grads=params.trainable_bytes / N, optimizer=optimizer_bytes / N,
                    master=0, buffers=gathered)
    stage = int(strategy[-1])
    zero = dict(DEEPSPEED_DEFAULTS, **(ds_zero or {}))
    shard = lambda value, from_stage: value / N if stage >= from_stage else value  # noqa: E731
    fp32_grads = nt * 4 if mixed else 0
    buffers = 0
    if stage in (1, 2) and N > 1:
        buffers = min(int(zero["reduce_bucket_size"]), nt) * c
    if stage == 3 and N > 1:
        buffers = min(int(zero["stage3_max_live_parameters"]), n) * c
    master = nt * 4 if (mixed or stage >= 1) else 0
    return dict(params=shard(n * c, 3), grads=shard(nt * c, 2) + shard(fp32_grads, 1),
                optimizer=shard(optimizer_bytes, 1), master=shard(master, 1), buffers=buffers)


def plan(config, overrides=(), gpus=(1, 8), card="h200", activations=True, sp=None):
    """The plan as a dict (what --json prints). `sp`: sequence-parallel sizes to plan DDP and FSDP at (default
    1 and the config's sp_size)."""
    from ..engine.block_classes import wrap_class_names
    from .config_only import config_only_models
    from .memory_counts import count_parameters, optimizer_state_bytes
    from .offline import build_model, offline_trainer
    card_bytes = parse_card(card)
    trainer = offline_trainer(config, overrides, device="meta")
    cfg, train = trainer.config, trainer.config.train
    try:
        with config_only_models():  # from_pretrained: the config's model, no weights read (config_only.py)
            model = build_model(trainer)
    except Exception as e:  # e.g. a from_pretrained whose config is neither local nor in the hub cache
        first = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"get_models could not build the model on the meta device ({type(e).__name__}: {first});"
                          " plan needs a get_models that builds the model without reading its weights"
                          " (transformers' and diffusers' from_pretrained are built from their config)") from e
    fsdp = cfg.launch.get("fsdp_config") or {}
    wrap = wrap_class_names(model, fsdp) if fsdp.get("fsdp_transformer_layer_cls_to_wrap") else []
    params = count_parameters(model, wrap)
    optimizer_bytes, optimizer_names = optimizer_state_bytes(trainer, model)
    precision = trainer.mixed_precision or "no"
    mixed = precision != "no"
    checkpointing = train.activation_checkpointing
    accumulation = int(train.gradient_accumulation_steps or 1)
    counted, notes = {}, {}
    # Our torch strategies run the model as built under autocast; DeepSpeed's engine holds it in bf16/fp16.
    for engine, dtype in (("torch", None), ("deepspeed", AUTOCAST_DTYPES[precision] if mixed else None)):
        if not activations:
            counted[engine], notes[engine] = None, "not estimated"
        elif engine == "deepspeed" and dtype is None:
            counted[engine], notes[engine] = counted.get("torch"), notes.get("torch")
        else:
            counted[engine], notes[engine] = _activations(config, overrides, dtype)
    ds_zero, stage = _deepspeed_zero(cfg)
    configured = {"NO": "NO", "MULTI_GPU": "DDP", "DDP": "DDP", "FSDP": "FSDP",
                  "DEEPSPEED": f"ZERO{stage}"}.get(cfg.launch.distributed_type)
    mesh = cfg.launch.get("parallelism_config") or {}
    sp_sizes = sorted(set(sp or ()) | {1, int(mesh.get("sp_size", 1))})
    auto_budget = _auto_budget(train.get("checkpointing_memory_budget"), card_bytes)
    rows = []
    for strategy in STRATEGIES:
        act = counted["deepspeed" if strategy.startswith("ZERO") else "torch"]
        # 'selective': the blocks keep their matmul and attention outputs besides their inputs
        selective = checkpointing == "selective"
        blocks = 0 if act is None or checkpointing in (False, None) else \
            _configured_blocks(act, train.activation_class_names)
        replicas = int(mesh.get("dp_replicate_size", 1)) if strategy == configured == "FSDP" else 1
        for count in gpus:
            for size in sp_sizes:
                if size > 1 and (strategy not in ("DDP", "FSDP") or count % size):
                    continue  # the engines that take sp; an SP group within the GPUs
                shard = count // replicas if count % replicas == 0 else None
                row = per_gpu(strategy, count, params, optimizer_bytes, mixed, ds_zero, shard=shard)
                if row is None:
                    continue
                row = {k: int(v) for k, v in row.items()}
                n = blocks
                if checkpointing == "auto" and act is not None:  # the first blocks this card needs (trainer's rule)
                    n = _auto_blocks(act, row, size, accumulation, auto_budget)
                act_rank = None if act is None else -(-act.with_first_checkpointed(n, selective) // size)
                rows.append(dict(strategy=strategy, gpus=count, sp=size,
                                 configured=strategy == configured and size == int(mesh.get("sp_size", 1)),
                                 **row, activations=act_rank, checkpointed_blocks=None if act is None else n,
                                 **_peak(row, act, n, size, accumulation, card_bytes, selective)))
    return dict(
        config=config if isinstance(config, str) else "config", card=str(card), card_bytes=card_bytes,
        fit_fraction=FIT_FRACTION, mixed_precision=precision, optimizer=optimizer_names,
        gradient_accumulation_steps=accumulation,
        micro_batch=cfg.dataloaders.train.get("batch_size_per_gpu"),
        parameters=dict(numel=params.numel, trainable=params.trainable_numel, bytes=params.bytes,
                        trainable_bytes=params.trainable_bytes, buffer_bytes=params.buffer_bytes,
                        by_dtype=params.by_dtype),
        optimizer_state_bytes=optimizer_bytes, activation_checkpointing=checkpointing,
        checkpointing_budget=int(auto_budget) if checkpointing == "auto" else None,
        activations={engine: None if act is None else dict(vars(act)) for engine, act in counted.items()},
        activations_notes=notes, rows=rows)


def _activations(config, overrides, engine_dtype):
    """(ActivationCount or None, a note): counted on a fresh build of the model on fake CPU tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .config_only import config_only_models
    from .memory_counts import count_activations
    from .offline import build_model, offline_trainer
    trainer = offline_trainer(config, overrides, device="cpu")
    try:
        def build(mode):
            with config_only_models():
                return build_model(trainer, fake=mode)
        act = count_activations(trainer, build,
                                FakeTensorMode(allow_non_fake_inputs=True), engine_dtype=engine_dtype)
    except Exception as e:  # the project's forward may need real values (.item(), data-dependent shapes)
        first = str(e).splitlines()[0][:160] if str(e) else ""
        return None, f"not estimated ({type(e).__name__}: {first})"
    return act, act.note


def _configured_blocks(act, class_names):
    """How many first blocks (in run order) activation_checkpointing=True checkpoints: all, or with
    "Class__##__N" entries the first N of each class when those are the first blocks that run (else all)."""
    from ..engine.block_classes import parse_class_names
    limits, taken, flags = parse_class_names(class_names), {}, []
    for name in act.block_order:
        taken[name] = taken.get(name, 0) + 1
        flags.append(limits.get(name) is None or taken[name] <= limits[name])
    n = flags.index(False) if False in flags else len(flags)
    return n if not any(flags[n:]) else act.blocks


def _auto_budget(setting, card_bytes):
    """The budget activation_checkpointing='auto' plans for on the card: train.checkpointing_memory_budget
    (a fraction of the card or a size, at most the card), unset the card's fit fraction (the trainer's rule
    with the whole card free)."""
    from ..engine.activation_checkpointing import memory_budget_bytes
    if setting is None:
        return FIT_FRACTION * card_bytes
    return min(memory_budget_bytes(setting, card_bytes), card_bytes)


def _auto_blocks(act, row, sp, accumulation, budget):
    """The blocks activation_checkpointing='auto' checkpoints on this row: the fewest first blocks whose
    peak fits `budget` (trainers/activation_budget.py's rule)."""
    from ..trainers.activation_budget import choose_blocks
    states = sum(v for k, v in row.items() if k != "grads")
    return choose_blocks(act, states, row["grads"], budget, accumulation, sp)[0]


def _peak(row, act, n, sp, accumulation, card_bytes, selective=False):
    """peak: the states, then gradients and activations as they coexist in backward with the first `n`
    blocks checkpointed, `selective`ly or not (ActivationCount.backward_peak: the gradients made so far beside
    the block running its backward, recomputed if checkpointed; with accumulation the whole gradients
    throughout); without an activation count, the states and gradients. sum: every column added (a bound)."""
    base = sum(v for k, v in row.items() if k != "grads")
    act_bytes = 0 if act is None else -(-act.with_first_checkpointed(n, selective) // sp)
    peak = base + (row["grads"] if act is None else act.backward_peak(n, row["grads"], accumulation, sp, selective))
    fits = peak <= FIT_FRACTION * card_bytes
    return dict(peak=int(peak), sum=int(base + row["grads"] + act_bytes),
                fits=None if act is None and fits else fits)  # unknown unless the states alone overflow


def _deepspeed_zero(cfg):
    """(the DeepSpeed JSON's bucket sizes that the plan uses, its ZeRO stage) of the config's launch section."""
    try:
        ds, _ = read_deepspeed_config(cfg.launch.get("deepspeed_config"))
    except ConfigError:
        return {}, None
    zero = ds.get("zero_optimization") or {}
    sizes = {k: float(v) for k, v in zero.items() if k in DEEPSPEED_DEFAULTS and isinstance(v, (int, float))}
    return sizes, int(zero.get("stage", 0))


def _unit(result):
    return ("GiB", 2**30) if max(r["sum"] for r in result["rows"]) >= 2**30 else ("MiB", 2**20)


def format_plan(result):
    p = result["parameters"]
    unit, scale = _unit(result)

    def size(value):
        return "-" if value is None else f"{value / scale:.2f}"
    lines = [f"{result['config']}: {p['numel'] / 1e9:.3f}B parameters ({p['trainable'] / 1e9:.3f}B trainable; "
             + ", ".join(f"{d.replace('torch.', '')} {v['numel']:,}" for d, v in p["by_dtype"].items())
             + f"), mixed_precision={result['mixed_precision']}, optimizer {', '.join(result['optimizer'])}"
             f" ({result['optimizer_state_bytes'] / max(p['trainable'], 1):.2f} B/trainable param),"
             f" micro-batch {result['micro_batch']} x {result['gradient_accumulation_steps']} accumulated"]
    for engine, act in result["activations"].items():
        where = "NO/DDP/FSDP (autocast)" if engine == "torch" else "DEEPSPEED (engine dtype)"
        if act is None:
            lines.append(f"activations, {where}: {result['activations_notes'][engine]}")
            continue
        selective = ""
        if result["activation_checkpointing"] == "selective":
            from ..trainers.memory_counts import ActivationCount
            kept = ActivationCount(**act).with_first_checkpointed(act["blocks"], selective=True)
            selective = f" ({size(kept)} {unit} selectively)"
        lines.append(f"activations per micro-batch, {where}: {size(act['saved'])} {unit} saved for backward,"
                     f" {size(act['checkpointed'])} {unit} with {act['blocks']} blocks of"
                     f" {', '.join(act['block_classes']) or 'no class'} checkpointed{selective}"
                     f" (train.activation_checkpointing={result['activation_checkpointing']})"
                     + (f"; {act['note']}" if act["note"] else ""))
    lines.append(f"per GPU, {unit} (*: the config's strategy); peak: states + the gradients and activations held at"
                 f" once in backward (the gradients made so far beside the block being recomputed; all of them when"
                 f" accumulating); fits: peak <= {result['fit_fraction']:.0%} of {result['card']}"
                 f" ({result['card_bytes'] / 2**30:.1f} GiB)")
    header = ("strategy", "gpus", "sp", "params", "grads", "optimizer", "master", "buffers", "activations", "peak", "fits")
    table = [header] + [(r["strategy"] + ("*" if r["configured"] else ""), str(r["gpus"]), str(r["sp"]),
                         *(size(r[k]) for k in header[3:-1]), {True: "yes", False: "NO", None: "?"}[r["fits"]])
                        for r in result["rows"]]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table]
    return "\n".join(lines)


def plan_command(args):
    sp = parse_gpus(args.sp) if getattr(args, "sp", None) else None
    result = plan(args.config, args.overrides, parse_gpus(args.gpus), args.card, sp=sp)
    print(json.dumps(result, indent=1, default=str) if args.json else format_plan(result))
