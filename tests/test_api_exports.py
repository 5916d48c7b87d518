"""Every name GigaTrain 1.1.0 exports from `giga_train` and `giga_train.utils` exists here and takes
GigaTrain's arguments: the same names, in the same positional order, with the same defaults (ours may
add arguments after them). GIGATRAIN is the reference's signatures (tests/reference/api_signatures.py
under GigaTrain 1.1.0; a parameter: (name, "" / "VAR" for *args and **kwargs, default repr or None));
with the reference interpreter at hand the test also compares against it live."""
import inspect

import pytest

import giga_train
import giga_train.utils as utils
from tests.ref_compare import compare_with_reference

GIGATRAIN = {'Config': [('d', '', 'None'), ('kwargs', 'VAR', None)],
 'Config.copy': [],
 'Config.merge_from_file': [('filename', '', None)],
 'Config.pop': [('k', '', None), ('d', '', 'None')],
 'Config.save': [('filename', '', None)],
 'Config.setdefault': [('k', '', None), ('d', '', 'None')],
 'Config.to_dict': [('tuple_as_list', '', 'False')],
 'Config.update': [('e', '', 'None'), ('f', 'VAR', None)],
 'EMAModel': [('decay', '', '0.9999'), ('min_decay', '', '0.0'), ('optimization_step', '', '0'),
              ('update_after_step', '', '0'), ('use_ema_warmup', '', 'False'), ('inv_gamma', '', '1.0'),
              ('power', '', '0.6666666666666666'), ('rank', '', '0'), ('world_size', '', '1')],
 'EMAModel.get_decay': [('optimization_step', '', None)],
 'EMAModel.load_config': [('config', '', None)],
 'EMAModel.load_state_dict': [('state_dict', '', None), ('device', '', 'None'), ('dtype', '', 'None')],
 'EMAModel.save_config': [('save_path', '', None)],
 'EMAModel.state_dict': [('device', '', 'None'), ('dtype', '', 'None')],
 'EMAModel.step': [('state_dict', '', None)],
 'OPTIMIZERS': None,
 'ParallelBatchSampler': [('batch_sampler', '', None), ('data_parallel_size', '', None)],
 'ParallelBatchSampler.set_epoch': [('epoch', '', None)],
 'Registry': [('args', 'VAR', None), ('kwargs', 'VAR', None)],
 'Registry.register': [('module_class', '', None)],
 'Registry.register_module': [('module_class', '', None), ('module_name', '', 'None')],
 'SAMPLERS': None,
 'SCHEDULERS': None,
 'TRANSFORMS': None,
 'build_module': [('registry', '', None), ('params_or_type', '', None), ('args', 'VAR', None),
                  ('kwargs', 'VAR', None)],
 'build_optimizer': [('params_or_type', '', None), ('args', 'VAR', None), ('kwargs', 'VAR', None)],
 'build_sampler': [('params_or_type', '', None), ('args', 'VAR', None), ('kwargs', 'VAR', None)],
 'build_scheduler': [('params_or_type', '', None), ('optimizer', '', None), ('args', 'VAR', None),
                     ('kwargs', 'VAR', None)],
 'build_transform': [('params_or_type', '', None), ('args', 'VAR', None), ('kwargs', 'VAR', None)],
 'load_config': [('config_or_path', '', None)],
 'merge_params': [('params_or_type', '', None), ('kwargs', 'VAR', None)],
 'module_auto_wrap_policy': [('module_names', '', None), ('sep', '', "'__##__'")],
 'schedulers.BaseScheduler': [('epoch_size', '', None), ('max_epochs', '', None), ('max_steps', '', None),
                              ('start_value', '', '1.0'), ('end_value', '', '0.0')],
 'schedulers.ConstantScheduler': [('kwargs', 'VAR', None)],
 'schedulers.CosineScheduler': [('weight', '', '1.0'), ('kwargs', 'VAR', None)],
 'schedulers.CycleScheduler': [('mode', '', "'triangular'"), ('gamma', '', '1'), ('step_size', '', '0'),
                               ('step_epoch', '', '0'), ('kwargs', 'VAR', None)],
 'schedulers.FuncScheduler': [('func', '', None), ('kwargs', 'VAR', None)],
 'schedulers.LinearScheduler': [('kwargs', 'VAR', None)],
 'schedulers.PolyScheduler': [('power', '', '2'), ('method', '', '1'), ('kwargs', 'VAR', None)],
 'schedulers.StepScheduler': [('step_factor', '', '0.1'), ('step_size_list', '', 'None'),
                              ('step_epoch_list', '', 'None'), ('kwargs', 'VAR', None)],
 'schedulers.WarmupCosineScheduler': [('warmup_steps', '', None), ('decay_steps', '', None),
                                      ('kwargs', 'VAR', None)],
 'ssh_copy_id': [('ips', '', None), ('username', '', None), ('password', '', None), ('port', '', None)],
 'utils.as_list': [('data', '', None)],
 'utils.create_logger': [('log_path', '', 'None'), ('log_format', '', 'None')],
 'utils.get_cpu_memory': [('unit', '', "'GB'")],
 'utils.get_cur_time': [],
 'utils.import_function': [('function_name', '', None), ('sep', '', "'.'")],
 'utils.load_state_dict': [('weight_path', '', None), ('weights_only', '', 'True')],
 'utils.save_state_dict': [('state_dict', '', None), ('save_path', '', None)],
 'utils.setup_environment': [],
 'utils.to_cpu': [('data', '', None)],
 'utils.to_cuda': [('data', '', None), ('device', '', 'None')],
 'utils.to_dtype': [('data', '', None), ('dtype', '', None)],
 'utils.to_list': [('data', '', None)],
 'utils.to_numpy': [('data', '', None)],
 'utils.to_tensor': [('data', '', None)],
 'utils.wait_for_gpu_memory': [('gpu_ids', '', None), ('gpu_memory', '', None), ('unit', '', "'GB'"),
                               ('seconds', '', '10'), ('count_limit', '', '-1')]}

# GigaTrain 1.1.0's runners and launcher (giga_train/trainers/trainer.py, testers/tester.py, distributed/launch.py
# in the 1.1.0 wheel; tests/reference/api_signatures.py prints the constructors and launch_from_config live).
GIGATRAIN_RUNNERS = {'Launcher': [('gpu_ids', '', None), ('num_machines', '', 'None'), ('distributed_type', '', 'None'),
              ('main_process_ip', '', "'127.0.0.1'"), ('main_process_port', '', 'None'),
              ('num_cpu_threads_per_process', '', '2'), ('nccl_socket_ifname', '', 'None'),
              ('save_config_path', '', 'None'), ('save_hostfile_path', '', 'None'), ('env', '', 'None'),
              ('executable', '', 'None'), ('until_completion', '', 'False'), ('kwargs', 'VAR', None)],
 'Launcher.launch': [('script', '', None)],
 'Tester': [('project_dir', '', None), ('mixed_precision', '', 'None'), ('log_interval', '', '100'),
            ('seed', '', '6666'), ('logging_dir', '', 'None'), ('kwargs', 'VAR', None)],
 'Trainer': [('project_dir', '', None), ('max_epochs', '', '0'), ('max_steps', '', '0'),
             ('gradient_accumulation_steps', '', '1'), ('mixed_precision', '', 'None'),
             ('dynamo_config', '', 'None'), ('ddp_config', '', 'None'), ('fp8_config', '', 'None'),
             ('data_parallel_size', '', '1'), ('log_with', '', 'None'), ('log_interval', '', '1'),
             ('log_cpu_memory', '', 'True'), ('checkpoint_interval', '', '1'), ('checkpoint_total_limit', '', '-1'),
             ('checkpoint_keeps', '', 'None'), ('checkpoint_save_optimizer', '', 'True'),
             ('checkpoint_safe_serialization', '', 'False'), ('checkpoint_strict', '', 'True'),
             ('activation_checkpointing', '', 'False'), ('activation_class_names', '', 'None'),
             ('with_ema', '', 'False'), ('allow_tf32', '', 'True'), ('seed', '', '6666'),
             ('logging_dir', '', 'None'), ('kwargs', 'VAR', None)],
 'launch_from_config': [('config_path', '', None), ('runners', '', 'None'), ('gpu_memory', '', 'None'),
                        ('seconds', '', '10')],
 'setup_environment': []}

# The public methods of GigaTrain 1.1.0's Trainer and Tester (read from the wheel's source: the hooks a project
# overrides and calls). get_models is declared (*args, **kwargs) there and called with one positional argument,
# the models section (trainer.py:635, tester.py:258): that call is what an override must keep working.
GIGATRAIN_HOOKS = {
    'Trainer': {'print': [('msg', '', None), ('args', 'VAR', None), ('kwargs', 'VAR', None)], 'state_dict': [],
                'load_state_dict': [('state_dict', '', None)], 'load': [('config_or_path', '', None)],
                'save_config': [('config', '', None)],
                'load_checkpoint': [('checkpoint', '', None), ('models', '', None), ('strict', '', 'True')],
                'get_checkpoint': [('checkpoint', '', 'None')], 'remove_checkpoint': [('total_limit', '', 'None')],
                'resume': [('checkpoint', '', 'None')], 'get_dataloaders': [('data_config', '', None)],
                'get_models': [('model_config', '', None)], 'get_optimizers': [('optimizers', '', None)],
                'get_schedulers': [('schedulers', '', None)], 'set_ema_models': [],
                'apply_activation_checkpointing': [('models', '', 'None')], 'apply_fp8': [('models', '', 'None')],
                'prepare': [('dataloaders', '', None), ('models', '', None), ('optimizers', '', None),
                            ('schedulers', '', None)],
                'train': [], 'forward_step': [('batch_dict', '', None)], 'backward_step': [('loss', '', None)],
                'save_checkpoint_step': [], 'print_before_train': [], 'print_step': [], 'print_after_train': [],
                'parse_losses': [('losses', '', None)]},
    'Tester': {'print': [('msg', '', None), ('args', 'VAR', None), ('kwargs', 'VAR', None)],
               'load': [('config_or_path', '', None)], 'get_checkpoint': [('checkpoint', '', 'None')],
               'get_dataloaders': [('data_config', '', None)], 'get_models': [('model_config', '', None)],
               'prepare': [('dataloaders', '', None), ('models', '', None)], 'test': [], 'print_before_test': [],
               'print_step': [], 'print_after_test': []},
}
# GigaTrain 1.1.0's Trainer and Tester properties (the same source).
GIGATRAIN_PROPERTIES = {
    'Trainer': ['project_dir', 'logging_dir', 'model_dir', 'distributed_type', 'num_processes', 'process_index',
                'local_process_index', 'is_main_process', 'is_local_main_process', 'is_last_process', 'device',
                'dtype', 'gradient_accumulation_steps', 'dataloaders', 'dataloader', 'models', 'model', 'optimizers',
                'optimizer', 'schedulers', 'scheduler', 'data_size', 'batch_size', 'epoch_size', 'max_epochs',
                'max_steps', 'cur_epoch', 'cur_step'],
    'Tester': ['project_dir', 'logging_dir', 'model_dir', 'distributed_type', 'num_processes', 'process_index',
               'local_process_index', 'is_main_process', 'is_local_main_process', 'is_last_process',
               'mixed_precision', 'device', 'dtype', 'dataloaders', 'dataloader', 'models', 'model', 'data_size',
               'batch_size', 'epoch_size', 'cur_step'],
}

# Where ours differs on purpose (docs/GIGATRAIN.md, "Coming from GigaTrain"). Each entry must still be a difference
# (test_every_listed_difference_is_real): a fixed one is taken off the list, a new one fails the tests.
ABSENT = {'Launcher', 'Launcher.launch',  # launching is torch's elastic agent: launch_from_config or giga-train train
          'Trainer.save_model_hook', 'Trainer.load_model_hook'}  # the Checkpointer writes and loads
# launch_from_config's first parameter is `config` here (a path, a module path or a dict): GigaTrain's positional
# call works, a keyword call `launch_from_config(config_path=...)` does not.
# Trainer.load_state_dict's parameter is `state` (a keyword call `load_state_dict(state_dict=...)` fails).
# ModuleDict.forward's first parameter is `name` (GigaTrain: `key`): self.model("lm", x) works in both.
RENAMED = {'ModuleDict.forward': {'key': 'name'}}
# Gaps, not choices (each must still be one): GigaTrain's ModuleDict.load_state_dict takes **kwargs and a
# `load_state_dict_mode='each'` attribute loads member by member; ours is torch's (strict, assign).
GAPS = {'ModuleDict.load_state_dict': ['ModuleDict.load_state_dict: takes no **kwargs']}
# The Trainer and Tester take the section as keywords (`cls(project_dir=..., **section)`, as GigaTrain's run_tasks
# calls them), so their defaults are the schema's: each GigaTrain default given explicitly means ours, but these.
DIFFERENT_DEFAULTS = {
    ('Trainer', 'log_with'): "'tensorboard' (GigaTrain: no tracker)",
    ('Trainer', 'log_interval'): '10 (GigaTrain: 1)',
    ('Trainer', 'checkpoint_interval'): 'no periodic checkpoints by steps (GigaTrain: every step)',
    ('Trainer', 'checkpoint_safe_serialization'): 'safetensors (GigaTrain: pickled .bin)',
}

BASE_SCHEDULER = ["epoch_size", "max_epochs", "max_steps", "start_value", "end_value"]


def resolve(name):
    parts = name.split(".")
    if parts[0] == "utils":
        return getattr(utils, parts[1], None)
    if parts[0] == "schedulers":
        import giga_train.schedulers as schedulers
        return getattr(schedulers, parts[1], None)
    obj = getattr(giga_train, parts[0], None)
    for part in parts[1:]:
        obj = getattr(obj, part, None)
    return obj


def incompatibilities(name, expected, obj, renamed=None):
    """What keeps a GigaTrain call of `name` (with `expected` parameters) from working on `obj`; `renamed` maps
    GigaTrain's parameter names to ours."""
    if obj is None:
        return [f"{name} is missing"]
    if expected is None:
        return []
    renamed = renamed or {}
    expected = [(renamed.get(n, n), var, default) for n, var, default in expected]
    params = [p for p in inspect.signature(obj).parameters.values() if p.name != "self"]
    by_name = {p.name: p for p in params}
    kinds = {p.kind for p in params}
    problems = []
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    expected_positional = [n for n, var, _ in expected if not var]
    if positional[:len(expected_positional)] != expected_positional:
        problems.append(f"{name}: positional arguments {positional}, GigaTrain's {expected_positional}")
    for pname, var, default in expected:
        if var and pname in ("args",) and inspect.Parameter.VAR_POSITIONAL not in kinds:
            problems.append(f"{name}: takes no *{pname}")
        elif var and pname not in ("args",) and inspect.Parameter.VAR_KEYWORD not in kinds:
            if not (name.startswith("schedulers.") and all(b in by_name for b in BASE_SCHEDULER)):
                problems.append(f"{name}: takes no **{pname}")
        elif not var and pname in by_name and default is not None:
            if repr(by_name[pname].default) != default:
                problems.append(f"{name}({pname}=...): default {by_name[pname].default!r}, GigaTrain's {default}")
    return problems


@pytest.mark.parametrize("name", sorted(GIGATRAIN))
def test_gigatrains_names_and_signatures(name):
    assert incompatibilities(name, GIGATRAIN[name], resolve(name)) == []


def runner_problems(name, expected):
    """Incompatibilities of a runner constructor (keywords checked against the schema) or of any other name."""
    if name in ("Trainer", "Tester"):
        return section_problems(name, expected)
    return incompatibilities(name, expected, resolve(name), RENAMED.get(name))


def filled(section_name, values, drop=()):
    """The section as validation fills it from `values` over the tiny job's (less the keys in `drop`)."""
    from giga_train import load_config
    from giga_train.launch.runners import validated_runners
    from tests.tiny import tiny_config
    cfg = tiny_config("/tmp/giga-train-signature-check")
    base = {k: v for k, v in cfg.get(section_name, {}).items() if k not in drop}
    cfg[section_name] = dict(base, **values)
    cfg = load_config(cfg)
    result = validated_runners(cfg)
    cfg = result if isinstance(result, dict) and section_name in result else cfg
    return cfg[section_name]


def section_problems(name, expected):
    """GigaTrain's Trainer(...) / Tester(...) keywords: each a key of our section, GigaTrain's default given
    explicitly filled as ours is, but for DIFFERENT_DEFAULTS."""
    from giga_train.schema import TEST, TRAIN
    schema, section_name = (TRAIN, "train") if name == "Trainer" else (TEST, "test")
    sig = inspect.signature(resolve(name))
    problems = []
    if list(sig.parameters)[0] != "project_dir" or inspect.Parameter.VAR_KEYWORD not in \
            {p.kind for p in sig.parameters.values()}:
        problems.append(f"{name}{sig}: not (project_dir, **section)")
    keys = [(n, default) for n, var, default in expected if not var and n not in ("project_dir",)]
    unknown = [n for n, _ in keys if n not in schema]
    problems += [f"{name}({n}=...): not a key of the {section_name} section" for n in unknown]
    # GigaTrain's max_steps=0 and max_epochs=0 both mean "not set", and a run needs one of them: each is compared
    # with the other one set.
    gigatrain = {n: eval(d) for n, d in keys if n not in unknown}
    given = [n for n in gigatrain if n != "max_steps"]
    pairs = [(filled(section_name, {}, drop=given), filled(section_name, {n: gigatrain[n] for n in given}), given)]
    if "max_steps" in gigatrain:
        pairs.append((filled(section_name, dict(max_epochs=1), drop=["max_steps"]),
                      filled(section_name, dict(max_epochs=1, max_steps=gigatrain["max_steps"])), ["max_steps"]))
    for ours, theirs, names in pairs:
        problems += [f"{name}({n}=...): GigaTrain's default fills {theirs[n]!r}, ours {ours[n]!r}"
                     f" (listed as different: {(name, n) in DIFFERENT_DEFAULTS})"
                     for n in names if (ours[n] != theirs[n]) != ((name, n) in DIFFERENT_DEFAULTS)]
    return problems


@pytest.mark.parametrize("name", sorted(set(GIGATRAIN_RUNNERS) - ABSENT))
def test_runner_and_launcher_signatures(name):
    assert runner_problems(name, GIGATRAIN_RUNNERS[name]) == []


@pytest.mark.parametrize("runner", sorted(GIGATRAIN_HOOKS))
def test_runner_hooks_and_properties(runner):
    cls = resolve(runner)
    problems = [p for hook, expected in GIGATRAIN_HOOKS[runner].items()
                for p in incompatibilities(f"{runner}.{hook}", expected, getattr(cls, hook, None),
                                           RENAMED.get(f"{runner}.{hook}"))]
    problems += [f"{runner}.{name} is not a property" for name in GIGATRAIN_PROPERTIES[runner]
                 if not isinstance(inspect.getattr_static(cls, name, None), property)]
    assert problems == []


def test_every_listed_difference_is_real():
    assert all(resolve(name) is None for name in ABSENT)
    for name, renames in RENAMED.items():
        params = inspect.signature(resolve(name)).parameters
        assert all(theirs not in params and ours in params for theirs, ours in renames.items()), name
    # the listed defaults differ: section_problems reports a listed key whose defaults agree
    assert section_problems("Trainer", GIGATRAIN_RUNNERS["Trainer"]) == []


def test_utils_is_importable_as_gigatrain_does():
    from giga_train import utils as imported
    assert imported is utils and giga_train.utils.as_list((1, 2)) == [1, 2]


def test_signatures_equal_the_live_reference():
    ref, ours = compare_with_reference("api_signatures.py")
    for name, expected in ref["names"].items():
        if name in ABSENT:
            assert expected not in (None, "missing") and resolve(name) is None, name
            continue
        if expected not in (None, "missing"):
            expected = [(n, "VAR" if k.startswith("VAR") else "", d) for n, k, d in expected if n != "self"]
        if name.split(".")[0] in ("Trainer", "Tester", "launch_from_config", "setup_environment"):
            assert expected == GIGATRAIN_RUNNERS[name], name  # the recorded data is the live reference's
            assert runner_problems(name, expected) == [], name
        else:
            assert incompatibilities(name, expected, resolve(name), RENAMED.get(name)) == GAPS.get(name, []), name


def test_gigatrains_module_paths_that_projects_import():
    from giga_train.optimizers.came_8bit import CAME8Bit  # noqa: F401
    from giga_train.strategies.activation_checkpointing import module_auto_wrap_policy
    from giga_train.strategies.ema import EMAModel, save_ema  # noqa: F401
    from giga_train.schedulers.build import SCHEDULERS, build_scheduler  # noqa: F401
    assert EMAModel is giga_train.EMAModel and module_auto_wrap_policy is giga_train.module_auto_wrap_policy
