"""tune_as as users install it: a wheel built from this checkout carries everything the code reads (the search
spaces included), and, installed on its own, runs a search and a report from a folder far from the
checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    """pyproject lists its packages (one is mapped from the top-level search_spaces/): a new subpackage that
    is not listed would be missing from every install but an editable one."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "tune_as").rglob("__init__.py")}
    assert listed == found | {"tune_as.search_spaces"}
    assert pyproject["tool"]["setuptools"]["package-dir"] == {"tune_as.search_spaces": "search_spaces"}
    assert (REPO / "search_spaces" / "__init__.py").is_file()


@pytest.mark.slow
def test_a_wheel_installed_alone_runs_a_search_and_a_report_from_another_folder(tmp_path: Path) -> None:
    # built from a copy of what git would ship: a `build/` folder left in the checkout by an earlier build
    # keeps files that no longer exist, and setuptools would package them again (a missing file could go
    # unnoticed)
    source = tmp_path / "source"
    for part in ("pyproject.toml", "README.md", "tune_as", "search_spaces"):
        if (REPO / part).is_dir():
            shutil.copytree(REPO / part, source / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(REPO / part, source / part)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("tune_as-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"tune_as/search_spaces/{p.name}" for p in (REPO / "search_spaces").glob("*.yaml")} <= set(names)
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
                                "--target", str(site), str(wheel)], capture_output=True, text=True,
                               timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the wheel's tune_as, not this checkout's (its dependencies come from the test's environment)
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "TUNE_AS_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_ADDRESS", None)
    where = subprocess.run([sys.executable, "-c",
                            "import tune_as.space.search_space as s; print(s.SPACES_DIR)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip() == str(site / "tune_as" / "search_spaces"), where.stdout + where.stderr
    search = subprocess.run([str(site / "bin" / "tune-as-search"), "--task", "digits", "--smoke", "--losses",
                             "softmax,sparsemax", "--trials-per-loss", "1", "--max-epochs", "1",
                             "--confirm", "2",
                             # not what this test is about: ~12 CPU s less (docs/benchmarks.md)
                             "--no-dashboard"],
                            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)
    assert search.returncode == 0, search.stdout[-3000:] + search.stderr[-3000:]
    assert "digits: which loss wins" in search.stdout
    report = subprocess.run([str(site / "bin" / "tune-as-report"), "--experiment", "digits", "--out",
                             "report"],
                            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert list((elsewhere / "report").glob("answer_*.csv")), \
        sorted(p.name for p in (elsewhere / "report").iterdir())
