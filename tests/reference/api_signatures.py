"""The call signatures of everything `giga_train` and `giga_train.utils` export, and of the public
methods of its exported classes, under whichever interpreter runs this. Prints {"version",
"names": {qualified name: [[param, kind, default repr or null], ...] or null if not callable}}."""
import inspect
import json
import sys

TOP = ["Config", "load_config", "Launcher", "launch_from_config", "ssh_copy_id", "ModuleDict", "OPTIMIZERS",
       "build_optimizer", "Registry", "build_module", "merge_params", "SAMPLERS", "ParallelBatchSampler",
       "build_sampler", "SCHEDULERS", "build_scheduler", "EMAModel", "module_auto_wrap_policy", "Tester", "Trainer",
       "TRANSFORMS", "build_transform", "setup_environment"]
UTILS = ["to_cpu", "to_cuda", "to_dtype", "to_list", "to_numpy", "to_tensor", "setup_environment", "create_logger",
         "as_list", "get_cpu_memory", "get_cur_time", "import_function", "load_state_dict", "save_state_dict",
         "wait_for_gpu_memory"]
SCHEDULERS = ["BaseScheduler", "ConstantScheduler", "LinearScheduler", "PolyScheduler", "CosineScheduler",
              "WarmupCosineScheduler", "CycleScheduler", "StepScheduler", "FuncScheduler"]


def describe(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, None if p.default is p.empty else repr(p.default)] for p in sig.parameters.values()]


def collect():
    import giga_train
    import giga_train.utils as utils
    out = {}
    for name in TOP:
        obj = getattr(giga_train, name, None)
        out[name] = describe(obj) if obj is not None else "missing"
        if inspect.isclass(obj) and name not in ("Trainer", "Tester"):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and callable(member):
                    out[f"{name}.{attr}"] = describe(member)
    for name in UTILS:
        obj = getattr(utils, name, None)
        out[f"utils.{name}"] = describe(obj) if obj is not None else "missing"
    for name in SCHEDULERS:
        obj = giga_train.SCHEDULERS.get(name) if name != "BaseScheduler" else None
        if obj is None:
            import giga_train.schedulers as schedulers
            obj = getattr(schedulers, name, None)
        out[f"schedulers.{name}"] = describe(obj) if obj is not None else "missing"
    return out


if __name__ == "__main__":
    import giga_train
    json.dump(dict(version=giga_train.__version__, names=collect()), sys.stdout, indent=1)
