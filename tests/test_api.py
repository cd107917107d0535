"""The public API: curated, sorted, complete, and cheap to import."""

import subprocess
import sys

import raysleuth


def test_all_is_sorted_and_unique():
    assert raysleuth.__all__ == sorted(set(raysleuth.__all__))


def test_every_public_name_resolves():
    missing = []
    for name in raysleuth.__all__:
        try:
            value = getattr(raysleuth, name)
        except Exception as error:  # report all of them at once
            missing.append(f"{name}: {type(error).__name__}: {error}")
            continue
        assert value is not None, name
    assert not missing, "public names that do not resolve:\n" + "\n".join(missing)


def test_unknown_name_is_an_attribute_error():
    try:
        raysleuth.no_such_thing  # noqa: B018
    except AttributeError as error:
        assert "no_such_thing" in str(error)
    else:
        raise AssertionError("expected AttributeError")


def test_import_is_cheap():
    """``import raysleuth`` must not pull in Ray or torch (instruments import it everywhere)."""
    code = "import sys, raysleuth; print('ray' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_no_module_imports_ray_or_torch_when_it_is_imported():
    """Every raysleuth module imports Ray and torch inside the functions that use them (CONTRIBUTING: lazy imports)."""
    code = ("import importlib, pkgutil, sys, raysleuth\n"
            "names = [m.name for m in pkgutil.walk_packages(raysleuth.__path__, 'raysleuth.')"
            " if not m.name.endswith('__main__')]\n"
            "for name in sorted(names):\n"
            "    importlib.import_module(name)\n"
            "print(len(names), 'ray' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    count, ray, torch = out.split()
    assert int(count) > 150 and (ray, torch) == ("False", "False"), out
