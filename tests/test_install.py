"""Install it anywhere: the wheel (and an editable install) runs the quickstart from any directory.

Each install goes into a throwaway virtual environment layered on this one (a .pth line adds
this interpreter's site-packages, so torch & co. are not installed again: seconds, no network).
Only plain path lines are added, so an editable install of the checkout in the outer
environment (CI's `pip install -e .`) is not visible inside. The quickstart then runs from an
empty directory and from one holding empty data/, models/, trainer/, fileio/ and configs/ folders,
which Python would import as namespace packages if they came first.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ["-m", "trainer", "+experiment=quickstart", "train.steps=3"]
SHADOWING_FOLDERS = ("data", "models", "trainer", "fileio", "configs")
NOT_SOURCE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "dist", "outputs", "runs", "wandb",
                                    ".pytest_cache", ".venv", ".whl", ".te", "*.pyc")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the checkout, so building leaves nothing in it."""
    copy = tmp_path_factory.mktemp("source") / "hybrid-nvfp4"
    shutil.copytree(ROOT, copy, ignore=NOT_SOURCE)
    return copy


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """One HOME for every run: the data cache (~/.cache/hybrid-nvfp4) is prepared once."""
    return tmp_path_factory.mktemp("home")


def layered_venv(path: Path) -> Path:
    """A venv without pip whose site-packages also sees this interpreter's; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    child_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
    parents = dict.fromkeys(site.getsitepackages() + [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    # "zz": after the child's own .pth files, so the child's packages come first on sys.path.
    Path(child_site, "zz_parent_environment.pth").write_text("\n".join(parents) + "\n")
    return python


def pip_install(python: Path, *arguments: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                             "--no-build-isolation", "--ignore-installed", "--no-index", "-q", *arguments],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def start_quickstart(python: Path, cwd: Path, home: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYBRID_RUN_DIR")}
    # One thread each: the runs go side by side on a 2-core machine (the first prepares the data
    # cache under its file lock while the others wait for it).
    env.update(HOME=str(home), WANDB_SILENT="true", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    # Output to a file, not a pipe: a run blocked on a full pipe while holding the data lock
    # would stall the others.
    log = open(cwd.parent / f"{cwd.name}.log", "w")
    return subprocess.Popen([str(python), *QUICKSTART], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)


def assert_quickstart_ran(process: subprocess.Popen, cwd: Path, imported_from: Path) -> None:
    process.wait(timeout=900)
    output = (cwd.parent / f"{cwd.name}.log").read_text()
    assert process.returncode == 0, f"in {cwd}:\n{output[-5000:]}"
    runs = list((cwd / "outputs").glob("*/*"))
    assert len(runs) == 1, runs
    metrics = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 3
    assert (runs[0] / "config.yaml").is_file() and (runs[0] / ".hydra" / "config.yaml").is_file()
    run = json.loads((runs[0] / "run_info.json").read_text())
    assert Path(run["source"]).resolve() == imported_from.resolve()  # the installed code ran, not the cwd's
    for folder in SHADOWING_FOLDERS:
        if (cwd / folder).exists():
            assert not any((cwd / folder).iterdir()), f"something was written into {folder}/"


def working_directories(root: Path):
    empty = root / "empty"
    empty.mkdir(parents=True)
    shadowed = root / "shadowed"
    for folder in SHADOWING_FOLDERS:
        (shadowed / folder).mkdir(parents=True)
    return [empty, shadowed]


def build_wheel(source: Path, dist: Path) -> Path:
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(dist), str(source)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return next(dist.glob("hybrid_nvfp4-*.whl"))


def test_wheel_holds_the_configs_and_the_packages(source, tmp_path):
    names = set(zipfile.ZipFile(build_wheel(source, tmp_path)).namelist())
    shipped = {f"configs/{p.relative_to(ROOT / 'configs').as_posix()}" for p in (ROOT / "configs").rglob("*.yaml")}
    assert shipped and shipped <= names, sorted(shipped - names)
    assert {"trainer/__main__.py", "data/__init__.py", "models/__init__.py", "models/quant/linear.py"} <= names
    assert {"data/sources/kind.py", "trainer/checkpoint/checkpointer.py", "trainer/hf/export.py",
            "fileio/hashing.py", "study/runner.py", "reports/compare_runs.py"} <= names  # the subpackages too
    assert not any(name.startswith(("tests/", "scripts/", "docs/")) for name in names)


def test_wheel_and_editable_installs_run_the_quickstart_anywhere(source, home, tmp_path):
    wheel_python = layered_venv(tmp_path / "wheel-venv")
    pip_install(wheel_python, str(build_wheel(source, tmp_path / "dist")))
    wheel_site = Path(subprocess.run([str(wheel_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    editable_python = layered_venv(tmp_path / "editable-venv")
    pip_install(editable_python, "-e", str(source))

    runs = []
    for python, installed, where in ((wheel_python, wheel_site, "wheel"), (editable_python, source, "editable")):
        for cwd in working_directories(tmp_path / where):
            runs.append((start_quickstart(python, cwd, home), cwd, installed))
    for process, cwd, installed in runs:
        assert_quickstart_ran(process, cwd, imported_from=installed)
