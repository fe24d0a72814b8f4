"""The package as pip builds it."""

from __future__ import annotations

from pathlib import Path


def test_the_package_metadata_builds_without_setuptools_deprecations() -> None:
    """`license = { text = ... }` printed setuptools' "project.license as a TOML table is deprecated" block three
    times on every install (issue 39); an SPDX string needs setuptools 77."""
    import tomllib

    data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert isinstance(data["project"]["license"], str)
    assert "setuptools>=77" in data["build-system"]["requires"]
    assert not any(c.startswith("License ::") for c in data["project"].get("classifiers", []))  # refused beside it
