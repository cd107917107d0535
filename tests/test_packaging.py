"""What pyproject.toml promises: the Ray range the suite runs on, and every library the code imports."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = {Requirement(text).name: Requirement(text)
                for text in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}


def test_ray_is_pinned_to_the_tested_minor_version():
    import ray

    ray_requirement = REQUIREMENTS["ray"]
    assert Version(ray.__version__) in ray_requirement.specifier, (ray.__version__, ray_requirement)
    upper = [spec for spec in ray_requirement.specifier if spec.operator == "<"]
    assert upper, f"{ray_requirement}: no upper bound, a new Ray could break private names untested"
    assert Version(upper[0].version) <= Version(f"{Version(ray.__version__).major}."
                                                f"{Version(ray.__version__).minor + 1}")


def test_xxhash_is_a_declared_dependency():
    assert "xxhash" in REQUIREMENTS  # without it fingerprints fall back to blake2b (labelled so)
