"""Registered kernels: each device package finds its family modules by their
``__all__``, both devices register the same names, a name registered twice
or a kernel a device lacks is reported with the modules and device it
concerns, and ``kernels.NAMES`` is derived, not kept by hand."""
import importlib
import pkgutil
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels
from numbagrad.kernels import _registry

cpu = kernels.get("cpu")


def test_both_devices_register_the_same_kernels():
    if not ng.cuda_available():
        pytest.skip(ng.cuda_unavailable_reason())
    names = {"cpu": cpu.KERNELS, "cuda": kernels.get("cuda").KERNELS}
    assert not _registry.missing(names), _registry.missing_report(names)


def test_missing_says_which_device_lacks_which_kernel():
    assert kernels.missing({"cpu": {"a", "b"}, "cuda": ["b", "a"]}) == {}
    assert kernels.missing_report({"cpu": {"a"}, "cuda": {"a"}}) == ""
    names = {"cpu": {"a", "b", "c"}, "cuda": {"a", "d"}}
    assert kernels.missing(names) == {"cpu": ["d"], "cuda": ["b", "c"]}
    assert kernels.missing_report(names) == "cpu lacks: d\ncuda lacks: b, c"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_module_with_all_registers_exactly_what_it_lists(device):
    if device == "cuda" and not ng.cuda_available():
        pytest.skip(ng.cuda_unavailable_reason())
    kern = kernels.get(device)
    listed = {"upload"}   # the package's own
    for info in pkgutil.iter_modules(kern.__path__):
        module = importlib.import_module(f"{kern.__name__}.{info.name}")
        for name in getattr(module, "__all__", ()):
            assert name not in listed
            listed.add(name)
            (serial, sname), (threaded, tname) = kern.KERNELS[name]
            assert serial is getattr(module, name) is getattr(kern, name) and sname == name
            if hasattr(module, name + "_mt"):
                assert threaded is getattr(module, name + "_mt") is getattr(kern, tname)
                assert tname == name + "_mt"
            else:
                assert (threaded, tname) == (serial, sname)
    assert set(kern.KERNELS) == listed
    assert kern.KERNEL_FNS[0]["unary"] is kern.unary
    for helper in ("_threads", "vmath", "boundary") if device == "cpu" else ("_core",):
        assert not hasattr(importlib.import_module(f"{kern.__name__}.{helper}"), "__all__")


def test_names_is_derived_from_the_registry():
    assert kernels.NAMES == tuple(sorted(cpu.KERNELS))
    source = (Path(kernels.__file__).parent / "__init__.py").read_text()
    assert "NAMES = (" not in source and "NAMES += (" not in source


@pytest.fixture
def fake_device(tmp_path, monkeypatch):
    """Builds a throwaway device package under ``tmp_path`` that registers
    its modules as ``kernels/cpu`` does, and returns its name (not yet
    imported); forgets it afterwards."""
    name = f"ng_fake_{tmp_path.name}"

    def build(modules: dict[str, str]) -> str:
        root = tmp_path / name
        root.mkdir()
        (root / "__init__.py").write_text(textwrap.dedent("""
            from numbagrad.kernels import _registry

            def empty(shape, dtype):
                return None

            def upload(host, out):
                out[...] = host

            KERNELS = _registry.register(globals(), own=("upload",))
        """))
        for module, text in modules.items():
            (root / f"{module}.py").write_text(textwrap.dedent(text))
        monkeypatch.syspath_prepend(str(tmp_path))
        return name

    yield build
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


def test_discovery_finds_new_modules_twins_and_skips_helpers(fake_device):
    name = fake_device({
        "alpha": '''
            __all__ = ["foo"]
            def foo(x): return x
            def foo_mt(x): return x
            def bar(x): return x      # not listed: not a kernel
        ''',
        "beta": '''
            from .helper import twice
            __all__ = ["baz"]
            def baz(x): return twice(x)
        ''',
        "helper": '''
            def twice(x): return 2 * x
        ''',
    })
    dev = importlib.import_module(name)
    assert set(dev.KERNELS) == {"foo", "baz", "upload"}
    assert dev.KERNELS["foo"] == ((dev.foo, "foo"), (dev.foo_mt, "foo_mt"))
    assert dev.KERNELS["baz"][1] == (dev.baz, "baz")
    assert dev.baz(3) == 6 and not hasattr(dev, "bar")


def test_a_kernel_registered_twice_names_both_modules(fake_device):
    name = fake_device({
        "first": '__all__ = ["foo"]\ndef foo(): pass\n',
        "second": '__all__ = ["foo"]\ndef foo(): pass\n',
    })
    with pytest.raises(ValueError, match=rf"kernel 'foo' is registered twice: by {name}\.first "
                                         rf"and by {name}\.second"):
        importlib.import_module(name)


@pytest.mark.parametrize("text, message", [
    ('__all__ = ["upload"]\ndef upload(h, o): pass\n', r"by ng_fake\w+ and by ng_fake\w+\.m"),
    ('__all__ = ["foo_mt"]\ndef foo_mt(): pass\n', r"list the serial kernel 'foo'"),
    ('__all__ = ["foo"]\n', r"registers 'foo' but defines no 'foo'"),
    ('__all__ = ["empty"]\ndef empty(): pass\n', r"kernel 'empty' clashes with ng_fake\w+\.empty"),
])
def test_bad_registrations_are_refused(fake_device, text, message):
    name = fake_device({"m": text})
    assert name.startswith("ng_fake")
    with pytest.raises(ValueError, match=message):
        importlib.import_module(name)


def test_a_missing_kernel_names_the_kernel_and_the_device():
    with pytest.raises(LookupError, match="device 'cpu' has no kernel 'nope'"):
        kernels.call(cpu, "nope", 0)
    lacking = types.SimpleNamespace(name="cuda", __name__="numbagrad.kernels.cuda",
                                    KERNELS={}, KERNEL_FNS=({}, {}), MT_MIN=1 << 60,
                                    MT_MIN_MEMORY=1 << 60)
    with pytest.raises(LookupError, match=r"device 'cuda' has no kernel 'fill' \(the cpu "
                                          r"kernels have it"):
        kernels.call(lacking, "fill", 0, np.zeros(2), 1.0)


def test_the_packages_observer_copy_follows_observe():
    class Quiet:
        def kernel(self, fn, name, args): ...
        def allocated(self, array): ...
        def temp(self, kern, shape, dtype): return None
        def host_read(self): ...
        def host_copy(self, copy, source): ...

    assert kernels._observer is None and kernels._hook._observer is None
    with kernels.observe(Quiet()) as seen:
        assert kernels._observer is seen and kernels._hook._observer is seen
    assert kernels._observer is None and kernels._hook._observer is None
