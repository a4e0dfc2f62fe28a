"""Install it anywhere: the wheel (and an editable install) runs the quickstart from any directory, every
command line a message or a doc names runs from the installed wheel (`python -m trainer.plan_run`, ...,
never a scripts/ path), and building leaves the source tree as it was (no build/, no egg-info).

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
INSTALLED_COMMANDS = ("trainer.prepare_data", "trainer.plan_run", "trainer.export_hf", "trainer.slurm",
                      "reports.compare_runs", "reports.gemm_report")
"""The tools a user runs, as `python -m MODULE` (tests/test_docs_commands.py checks the docs name these)."""
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


def _tree(root: Path) -> set:
    return {path.relative_to(root).as_posix() for path in root.rglob("*")}


def test_wheel_holds_the_configs_and_the_packages(source, tmp_path):
    before = _tree(source)
    names = set(zipfile.ZipFile(build_wheel(source, tmp_path)).namelist())
    assert _tree(source) == before  # no build/ (stale modules went into later wheels), no egg-info
    shipped = {f"configs/{p.relative_to(ROOT / 'configs').as_posix()}" for p in (ROOT / "configs").rglob("*.yaml")}
    assert shipped and shipped <= names, sorted(shipped - names)
    assert {"trainer/__main__.py", "data/__init__.py", "models/__init__.py", "models/quant/linear.py"} <= names
    assert {"data/sources/kind.py", "trainer/checkpoint/checkpointer.py", "trainer/hf/export.py",
            "fileio/hashing.py", "study/runner.py", "reports/compare_runs/__init__.py"} <= names  # the subpackages too
    assert {"trainer/plan_run.py", "trainer/prepare_data.py", "trainer/export_hf.py", "trainer/slurm.py",
            "trainer/slurm_train.sh", "reports/compare_runs/__main__.py", "reports/gemm_report/__main__.py"} <= names
    assert not any(name.startswith(("tests/", "scripts/", "docs/", "setup.py", "build/")) for name in names)


def test_pip_install_dot_leaves_the_source_tree_as_it_was(source, tmp_path):
    """`pip install .` as the README has it (here into a folder, not an environment): setuptools builds in a
    temporary directory (setup.py), so nothing appears beside the sources."""
    before = _tree(source)
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                             "-q", "--target", str(tmp_path / "target"), "."], cwd=source, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "target" / "trainer" / "plan_run.py").is_file()
    assert _tree(source) == before, sorted(_tree(source) - before)


def test_every_installed_command_runs_from_the_wheel_in_an_empty_directory(source, home, tmp_path):
    python = layered_venv(tmp_path / "venv")
    pip_install(python, str(build_wheel(source, tmp_path / "dist")))
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for module in INSTALLED_COMMANDS:
        result = subprocess.run([str(python), "-m", module, "--help"], cwd=empty, env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, (module, result.stderr[-2000:])
        assert result.stdout.startswith(f"usage: python -m {module}"), (module, result.stdout[:300])
    launcher = subprocess.run([str(python), "-m", "trainer.slurm"], cwd=empty, env=env, capture_output=True, text=True,
                              timeout=120).stdout.strip()
    assert launcher.endswith("trainer/slurm_train.sh") and Path(launcher).is_file()
    assert Path(launcher).is_relative_to(tmp_path / "venv")  # the wheel's copy, not the checkout's
    subprocess.run(["bash", "-n", launcher], check=True)
    plan = subprocess.run([str(python), "-m", "trainer.plan_run", "+experiment=nvfp4_12b", "--gpu", "B200", "--gpus",
                           "64"], cwd=empty, env=env, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr[-2000:]
    start = next(line for line in plan.stdout.splitlines() if line.startswith("Start it: "))
    assert '"$(python -m trainer.slurm)"' in start and "scripts/" not in plan.stdout  # what it prints runs here too


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
