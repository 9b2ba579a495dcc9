"""``constraints.txt`` (written by ``scripts/lock.sh``, installed against by ``scripts/setup.sh``) pins
every dependency ``pyproject.toml`` declares, with a version its specifier allows, and is what this
environment has installed.

Not checked: that the pinned set resolves on the package index today (``setup.sh`` on a fresh machine
does that), and transitive packages' pins beyond "installed = pinned".
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        pins[canonicalize_name(name)] = Version(version)
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return [Requirement(r) for r in [*project["dependencies"], *(r for group in extras.values() for r in group)]]


def test_every_declared_dependency_is_pinned_within_its_specifier() -> None:
    pins = _pins()
    missing = [str(r) for r in _declared() if canonicalize_name(r.name) not in pins]
    assert not missing, f"not in constraints.txt (run scripts/lock.sh after setup.sh --test): {missing}"
    outside = [f"{r} (pinned {pins[canonicalize_name(r.name)]})" for r in _declared()
               if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not outside, f"constraints.txt pins versions pyproject.toml does not allow: {outside}"


def test_installed_versions_are_the_pinned_ones() -> None:
    pins = _pins()
    differ = []
    for r in _declared():
        installed = Version(metadata.version(r.name))
        pinned = pins[canonicalize_name(r.name)]
        if installed.public != pinned.public:  # torch's "+cpu" local label is not pinned
            differ.append(f"{r.name}: installed {installed}, pinned {pinned}")
    assert not differ, f"this environment is not the locked one (rerun scripts/setup.sh): {differ}"
