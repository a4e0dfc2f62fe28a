"""Run a command line as a user does, in a separate process: an installed one as `python -m <module> ARGS`
(`run_script("trainer.export_hf", ...)`), a repository tool as `python scripts/<name>.py ARGS`.

Scripts import the packages plainly (no sys.path edits): a user's `pip install -e .` makes them
importable; here PYTHONPATH names this checkout, which is what that install amounts to. Tests
of the logic import the packages (reports, benchmarks, trainer, data); this is for the command
lines themselves (flags, exit status, what is printed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


class ScriptFailed(SystemExit, Exception):
    """A script's non-zero exit, carrying its status and the end of its stderr (the error it printed).

    A SystemExit, as the script's own exit was, and an Exception, as the error behind it was."""


def run_script(name: str, *arguments, cwd=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python -m <name>` (a dotted module name) or scripts/<name>.py with these arguments; a non-zero
    exit raises ScriptFailed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), env.get("PYTHONPATH")]))
    command = ["-m", name] if "." in name else [str(REPOSITORY / "scripts" / f"{name}.py")]
    result = subprocess.run([sys.executable, *command, *map(str, arguments)],
                            cwd=cwd or REPOSITORY, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise ScriptFailed(f"{' '.join(command)} exited with status {result.returncode}:\n{result.stderr[-4000:]}")
    return result
