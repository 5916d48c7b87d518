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
