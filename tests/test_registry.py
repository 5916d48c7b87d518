import pytest

from giga_train import TRANSFORMS
from giga_train.errors import RegistryError
from giga_train.registry import Registry


def test_register_forms_and_build():
    reg = Registry("thing")

    @reg.register
    class Plain:
        def __init__(self, size=1):
            self.size = size

    @reg.register(name="custom")
    class Named:
        pass

    reg.register(dict, name="plain_dict")
    assert reg.names() == ["Plain", "custom", "plain_dict"]
    assert reg.build(dict(type="Plain", size=3)).size == 3
    assert reg.build(dict(_class_name="Plain")).size == 1
    assert isinstance(reg.build(dict(type="custom")), Named)
    assert reg.get("collections.OrderedDict").__name__ == "OrderedDict"  # dotted paths import
    with pytest.raises(RegistryError, match=r"unknown thing 'Plan'; did you mean 'Plain'\? \(registered: Plain, custom"):
        reg.get("Plan")
    with pytest.raises(RegistryError, match="already registered"):
        reg.register(Named, name="Plain")
    with pytest.raises(RegistryError, match="thing 'Plain' takes no argument 'sise'; did you mean 'size'"):
        reg.check_arguments(dict(type="Plain", sise=2))


def test_transforms_registry_holds_the_examples():
    import examples.char_lm.data  # noqa: F401
    assert "RandomShift" in TRANSFORMS


def test_gigatrain_forms():
    from giga_train import Registry as PublicRegistry, build_module, merge_params
    reg = PublicRegistry()  # GigaTrain's: no name, a dict

    class Thing:
        def __init__(self, *args, size=1, **kwargs):
            self.args, self.size, self.kwargs = args, size, kwargs

    assert reg.register_module(Thing) is Thing and reg["Thing"] is Thing and "Thing" in reg
    reg.register("other")(Thing)
    assert sorted(reg.keys()) == ["Thing", "other"] and isinstance(reg, dict)
    built = build_module(reg, dict(type="Thing", size=2), "pos", extra=3)
    assert built.args == ("pos",) and built.size == 2 and built.kwargs == dict(extra=3)
    assert build_module(reg, "other", size=5).size == 5
    assert build_module(reg, None) is None and build_module(reg, dict(size=3)) is None
    cfg = dict(type="Thing", nested=dict(a=1))
    merged = merge_params(cfg, size=4)
    assert merged == dict(type="Thing", nested=dict(a=1), size=4)
    merged["nested"]["a"] = 2
    assert cfg["nested"]["a"] == 1  # the config is copied, never changed
    with pytest.raises(RegistryError, match="'size' is given both by the config and by the caller"):
        merge_params(dict(size=1), size=2)
    with pytest.raises(RegistryError, match="unknown registry 'Thin'; did you mean 'Thing'"):
        build_module(reg, "Thin")
    assert reg.get("missing", None) is None


def test_build_functions_in_gigatrain_form():
    import torch
    from giga_train import build_optimizer, build_sampler, build_transform
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(build_optimizer(dict(type="AdamW", lr=0.1), params=params), torch.optim.AdamW)
    assert isinstance(build_optimizer("SGD", params, lr=0.1), torch.optim.SGD)
    assert build_optimizer(dict(_class_name="torch.optim.Adam"), params).defaults["lr"] == 1e-3
    sampler = build_sampler(dict(type="DefaultSampler", shuffle=False, infinite=False), dataset=range(5), batch_size=2)
    assert list(sampler) == [0, 1, 2, 3, 4, 0]
    import examples.char_lm.data  # noqa: F401
    assert type(build_transform(dict(type="RandomShift"))).__name__ == "RandomShift"
    assert build_transform(None) is None


def test_providers_register_lazily_at_the_first_unknown_name():
    reg = Registry("thing")
    calls = []

    def provide(registry):
        calls.append(1)
        registry.register(dict, name="Late")

    reg.add_provider(provide)
    reg.register(list, name="Early")
    assert reg.get("Early") is list and calls == []
    assert reg.get("Late") is dict and calls == [1]
    with pytest.raises(RegistryError, match="unknown thing 'Other'"):
        reg.get("Other")
    assert calls == [1]


def test_a_class_may_stand_for_its_name():
    from giga_train import build_module
    reg = Registry("thing")
    assert build_module(reg, dict(type=dict, a=1)) == {"a": 1}
    assert reg.check_arguments(dict(type=dict)) is dict
