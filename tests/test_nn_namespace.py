"""``ng.nn``'s namespace: the layers, ``Module``, ``init`` and the package's own
submodules, nothing else (no ``np``, ``math``, ``Any`` or private helpers)."""
import inspect
import pkgutil
import types

from numbagrad import nn


def test_all_is_module_classes_and_the_submodules():
    assert len(set(nn.__all__)) == len(nn.__all__)
    for name in nn.__all__:
        value = getattr(nn, name)
        if name in ("init", "functional", "utils"):
            assert isinstance(value, types.ModuleType) and value.__name__ == f"numbagrad.nn.{name}"
        else:
            assert inspect.isclass(value) and issubclass(value, nn.Module), name
            assert value.__name__ == name


def test_every_public_layer_of_the_package_is_in_all():
    for info in pkgutil.iter_modules(nn.__path__):
        sub = getattr(nn, info.name)
        for name, value in vars(sub).items():
            if inspect.isclass(value) and issubclass(value, nn.Module) \
                    and value.__module__ == sub.__name__ and not name.startswith("_"):
                assert name in nn.__all__, f"{sub.__name__}.{name} is not in ng.nn.__all__"


def test_the_namespace_holds_nothing_else():
    for name in dir(nn):
        if name.startswith("__") and name.endswith("__"):
            continue
        assert not name.startswith("_"), f"private name {name!r} in ng.nn"
        value = getattr(nn, name)
        if isinstance(value, types.ModuleType):   # a submodule of the package, not np or math
            assert value.__name__ == f"numbagrad.nn.{name}", name
        else:
            assert name in nn.__all__, f"ng.nn.{name} is neither a submodule nor in __all__"
    for leaked in ("np", "math", "Any", "contextlib", "annotations", "Callable", "Iterator",
                   "Mapping", "ops", "kernels", "Tensor", "param", "is_scalar", "CHANGES"):
        assert not hasattr(nn, leaked), leaked


def test_star_import_gives_all():
    names: dict = {}
    exec("from numbagrad.nn import *", names)
    assert sorted(set(names) - {"__builtins__"}) == sorted(nn.__all__)
