"""Every command in README.md and docs/*.md runs as written.

Commands are taken from ```bash blocks, `$ ` lines of transcripts and inline code that starts
with a program (python, torchrun, pip, pytest, sbatch); `&&` chains are split. Each is handled
by what it needs:

- CPU-runnable (`python -m trainer ...`, the installed command lines `python -m trainer.prepare_data`,
  `reports.gemm_report`, `reports.compare_runs`, `trainer.export_hf`, `trainer.plan_run`, and the
  repository's scripts/bench_loader.py): run in a scratch directory with the
  placeholder paths of the docs (/data/corpus, /models/..., /lustre/...) pointing at tiny
  stand-ins and tiny overrides appended (a 6-block model, one step, a 512-token vocabulary);
- GPU, multi-node or network lines (torchrun, sbatch, the benchmarks, `--measure`,
  `--wandb-online`, Hub sources): parsed as their program parses them (torchrun's and the
  scripts' own argparse parsers, the trainer's override check and Hydra composition,
  `bash -n` for the SLURM script), not run;
- installs (`pip install ...`): the extras they name exist and pinned packages are the ones CI
  installs (.ci/run); pytest lines: their paths (and node ids' test functions) exist and their markers are registered;
- templates (`+experiment=<experiment>`) are not commands and are skipped; an installed command named
  without arguments in prose (`python -m reports.compare_runs`) must answer `--help`.

Scripts that write into the repository (study_report: docs/study.md, docs/images) write into
the scratch directory instead; the study scripts read the repository's study file; run_study runs
only `--list` (the runs themselves need the GPU).

A command no rule covers fails the test, so a new kind of command in the docs needs a rule.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
PROGRAMS = ("python ", "python3 ", "torchrun ", "pip ", "pytest", "sbatch ", "export ")
GPU_SCRIPTS = {"benchmark", "bench_mamba", "bench_quant", "bench_fp8_linear"}
"""Scripts that measure a CUDA GPU: parsed only."""
INSTALLED_COMMANDS = {"trainer.prepare_data": "prepare_data", "trainer.plan_run": "plan_run",
                      "trainer.export_hf": "export_hf", "trainer.slurm": "slurm",
                      "reports.compare_runs": "compare_runs", "reports.gemm_report": "gemm_report"}
"""`python -m MODULE` command lines the wheel installs -> the name the rules below know them by. The docs
name these, never a scripts/ path for them: scripts/ holds the repository's own tools (benchmarks, the
study), which the wheel does not carry."""
TINY_TRAINER = [
    "model=tiny", "model.vocab_size=512", "parallel=data_parallel", "parallel.compile=false", "data=builtin",
    "precision.keep_indivisible_in_bf16=true",  # tiny dims do not divide FP8's 128-blocks
    "data.builtin_vocab_size=512", "data.builtin_corpus_mb=0.3",
    "data.seq_len=64", "data.validation_batches=1", "data.validation_fraction=0.2", "train.steps=1",
    "train.micro_batch_size=2", "train.global_batch_size=2", "optim.warmup_steps=1", "logging.log_every=1",
    "logging.progress_bar=false", "logging.wandb.mode=disabled",
]
"""Appended to every trainer command that runs (later overrides win)."""
TINY_STEP = "step_00000001"
"""The last checkpoint of a tiny run, standing in for the docs' step_00000200."""


@dataclass
class Command:
    document: str
    line: int
    text: str
    inline: bool = False
    """Inline code in prose (`...`), not a line of a fenced block."""

    def __str__(self) -> str:
        return f"{self.document}:{self.line}: {self.text}"


def extract_commands(document: str) -> list:
    """The commands of one Markdown file, in order."""
    text = (ROOT / document).read_text()
    found = []
    for block in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        language, body = block.group(1), block.group(2)
        first_line = text[: block.start(2)].count("\n") + 1
        if language not in ("bash", "sh", "shell", "console", ""):
            continue
        for offset, line in _joined_lines(body):
            if language == "" and not line.startswith("$ "):
                continue  # an output transcript or a table, not commands
            found.append(Command(document, first_line + offset, line.removeprefix("$ ")))
    for span in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", text):
        if span.group(1).startswith(PROGRAMS):
            found.append(Command(document, text[: span.start()].count("\n") + 1, span.group(1), inline=True))
    found.sort(key=lambda command: command.line)
    return [Command(c.document, c.line, part.strip(), c.inline) for c in found for part in c.text.split("&&")]


def _joined_lines(body: str):
    """(line offset, command) with backslash continuations joined and `# comments` dropped."""
    pending, start = "", 0
    for offset, line in enumerate(body.splitlines()):
        if not pending:
            start = offset
        line = line.strip()
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        command = re.sub(r"(^|\s)#(\s.*)?$", "", pending + line).strip()
        pending = ""
        if command:
            yield start, command


ALL_COMMANDS = [command for document in DOCUMENTS for command in extract_commands(document)]


# ----------------------------------------------------------------------------------- stand-ins
@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A scratch working directory and the stand-ins for the docs' placeholder paths."""
    from data import DataConfig, build_tokenizer
    from trainer.hf.tokenizer import to_transformers

    root = tmp_path_factory.mktemp("docs")
    cache = root / "cache"
    tokenizer = build_tokenizer(DataConfig(builtin_vocab_size=512, builtin_corpus_mb=0.3, cache_dir=str(cache)))
    to_transformers(tokenizer).save_pretrained(root / "tokenizer")
    corpus = root / "corpus"
    corpus.mkdir()
    lines = [json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n"}) for i in range(60)]
    (corpus / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    _nemotron_h_directory(root / "nemotron_h", tokenizer)
    _write_own_configs(root / "work")
    substitutions = {
        "/data/corpus": str(corpus), "/data/code": str(root / "code"),
        "/models/nemotron-tokenizer": str(root / "tokenizer"), "/models/nemotron-12b": str(root / "tokenizer"),
        "/models/nemotron-nano-12b-v2-base": str(root / "nemotron_h"),
        "/lustre/shards": str(root / "shards"), "/fast/shards": str(root / "shards"),
        "/lustre/runs": str(root / "lustre_runs"), "$HEAD_NODE": "localhost", "step_00000200": TINY_STEP,
    }
    return {"root": root, "work": root / "work", "cache": cache, "substitutions": substitutions}


def _nemotron_h_directory(path: Path, tokenizer) -> None:
    """A tiny NemotronH checkpoint made by transformers, with the tiny tokenizer beside it."""
    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM

    from models.config import load_model_config
    from models.hf import hf_config_kwargs
    from trainer.hf.tokenizer import to_transformers

    torch.manual_seed(0)
    config = NemotronHConfig(**hf_config_kwargs(load_model_config("tiny", vocab_size=tokenizer.vocab_size)))
    NemotronHForCausalLM(config).save_pretrained(path)
    to_transformers(tokenizer).save_pretrained(path)


def _write_own_configs(work: Path) -> None:
    """The README's example of one's own config folder, written where it says."""
    readme = (ROOT / "README.md").read_text()
    for block in re.finditer(r"^```yaml\n(.*?)^```", readme, re.S | re.M):
        named = re.search(r"^# (my_configs/\S+\.yaml)", block.group(1), re.M)
        if named:
            (work / named.group(1)).parent.mkdir(parents=True, exist_ok=True)
            (work / named.group(1)).write_text(block.group(1))
    work.mkdir(exist_ok=True)


# ----------------------------------------------------------------------------------- handlers
def _words(command: Command, workspace) -> list:
    text = command.text
    for placeholder, stand_in in sorted(workspace["substitutions"].items(), key=lambda kv: -len(kv[0])):
        text = text.replace(placeholder, stand_in)
    words = shlex.split(text)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words.pop(0)  # environment assignments of the command
    return words


class _Parsed(Exception):
    """Raised instead of running a script once its parser accepted the arguments."""


def _load_script(name: str):
    """scripts/<name>.py as a module (registered in sys.modules, as its dataclasses need), or the command line
    of an installed module (`reports.compare_runs` -> its package's __main__)."""
    if "." in name:
        spec = importlib.util.find_spec(name)
        return importlib.import_module(f"{name}.__main__" if spec.submodule_search_locations else name)
    module_name = f"_docs_script_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def _run_script(name: str, arguments: list, monkeypatch, parse_only: bool):
    """Run scripts/<name>.py's main() in-process with these arguments (or only its argparse)."""
    module = _load_script(name)
    monkeypatch.setattr(sys, "argv", [module.__file__, *arguments])
    if parse_only:
        original = argparse.ArgumentParser.parse_args

        def parse_then_stop(self, args=None, namespace=None):
            raise _Parsed(original(self, args, namespace))

        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        with pytest.raises(_Parsed) as parsed:
            module.main()
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", original)
        return module, parsed.value.args[0]
    # The exit status the command would end with: SystemExit's code, or main()'s return value where
    # the script's __main__ block exits with it (`sys.exit(main())`); others ignore what main returns.
    passes_result = re.search(r"exit\(main\(", Path(module.__file__).read_text()) is not None
    try:
        result = module.main()
        status = result if passes_result else 0
    except SystemExit as exit_:
        status = exit_.code
    return module, 0 if status is None else status


def _parse_trainer(arguments: list):
    """What `python -m trainer ARGS` checks before running: the override keys, then Hydra composition."""
    from trainer.__main__ import unknown_key_message
    from trainer.config import compose

    config_dir, overrides = None, []
    words = iter(arguments)
    for word in words:
        if word == "--config-dir":
            config_dir = next(words)
        elif word.startswith("--config-dir="):
            config_dir = word.split("=", 1)[1]
        else:
            assert not word.startswith("-"), f"trainer flag {word} is not handled here"
            message = unknown_key_message(word)
            assert message is None, message
            overrides.append(word)
    return config_dir, overrides, compose(overrides, config_dir=config_dir)


def _run_trainer(arguments: list, workspace, index: int) -> None:
    from trainer.config import compose
    from trainer.loop import train

    config_dir, overrides, _ = _parse_trainer(arguments)
    cfg = compose(overrides + TINY_TRAINER + [f"data.cache_dir={workspace['cache']}"], config_dir=config_dir)
    if cfg.run_dir is None:  # the CLI's Hydra output directory
        cfg.run_dir = str(workspace["work"] / "outputs" / f"run{index}")
    assert train(cfg)["status"] == "completed"


def _fake_run(path: Path) -> None:
    """A run directory for compare_runs: metrics.jsonl with loss, lr and val_loss."""
    path.mkdir(parents=True, exist_ok=True)
    lines = [{"step": s, "tokens": 1000 * s, "loss": 5.0 / s ** 0.1, "lr": 1e-3 if s < 80 else 1e-3 * (100 - s) / 20,
              "val_loss": 5.1 / s ** 0.1} for s in range(1, 101)]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


_HANDLED: dict = {}
"""(command text, inline) -> what was done: a command repeated in several documents runs once."""


def handle(command: Command, workspace, monkeypatch, index: int) -> str:
    """Run or parse one command (once per text); returns what was done (for the log)."""
    if (command.text, command.inline) not in _HANDLED:
        _HANDLED[command.text, command.inline] = _handle(command, workspace, monkeypatch, index)
    return _HANDLED[command.text, command.inline]


def _handle(command: Command, workspace, monkeypatch, index: int) -> str:
    if re.search(r"<\w+>", command.text):
        return "a template (<placeholders>), not a command"
    words = _words(command, workspace)
    program = words[0]
    if program == "export":
        subprocess.run(["bash", "-n", "-c", command.text], check=True)
        return "shell syntax"
    if program == "pip":
        return _check_install(words)
    if program == "pytest" or words[:3] == ["python", "-m", "pytest"]:
        return _check_pytest(words[3:] if program == "python" else words[1:])
    if program == "torchrun":
        from torch.distributed.run import get_args_parser

        launch = get_args_parser().parse_args(words[1:])
        assert launch.module and launch.training_script == "trainer", command
        _parse_trainer(launch.training_script_args)
        return "parsed (torchrun + trainer)"
    if program == "sbatch":  # the installed launcher, found as the docs find it: "$(python -m trainer.slurm)"
        from trainer.slurm import SCRIPT

        script = next(w for w in words[1:] if w.endswith(".sh") or w == "$(python -m trainer.slurm)")
        assert script == "$(python -m trainer.slurm)", f"{command}: name the installed launcher, not a path"
        subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
        _parse_trainer(words[words.index(script) + 1:])
        return "parsed (sbatch script + trainer)"
    assert program in ("python", "python3"), f"no rule for {command}"
    if words[1:] == ["-m", "trainer", "--help"]:
        from trainer.__main__ import cli

        monkeypatch.setattr(sys, "argv", ["trainer", "--help"])
        cli()  # prints its help and returns, as `python -m trainer --help` exits 0
        return "ran (--help)"
    if words[1:3] == ["-m", "trainer"]:
        _run_trainer(words[3:], workspace, index)
        return "ran (tiny)"
    if words[1] == "-m":
        assert words[2] in INSTALLED_COMMANDS, f"no rule for the module of {command}"
        target, name, arguments = words[2], INSTALLED_COMMANDS[words[2]], words[3:]
        if not arguments and command.inline:  # named in prose ("two `python -m trainer.prepare_data` ..."): --help
            _, status = _run_script(target, ["--help"], monkeypatch, parse_only=False)
            assert status == 0, f"{command} --help ended with status {status}"
            return "named (--help)"
    else:
        script = Path(words[1])
        assert script.parent.as_posix() == "scripts" and (ROOT / script).is_file(), f"no such script: {command}"
        target, name, arguments = script.stem, script.stem, words[2:]
    if name in GPU_SCRIPTS or "--measure" in arguments or "--wandb-online" in arguments:
        _run_script(target, arguments, monkeypatch, parse_only=True)
        return "parsed (GPU or network)"
    if name == "prepare_data":
        module, flags = _run_script(target, arguments, monkeypatch, parse_only=True)
        cfg = module.load_data_config(flags.config, flags.overrides, flags)
        if any(source.kind == "hf" for source in cfg.sources):
            return "parsed (Hub source: network)"
        # One tokenizing process (the docs' --num-proc 64 / num_proc=16 are for big machines), a small
        # builtin corpus and tokenizer; options in front, key=value overrides at the end (argparse
        # takes the positional overrides as one run).
        if "--num-proc" in arguments:
            arguments[arguments.index("--num-proc") + 1] = "1"
        arguments = ["--num-proc", "1", "--no-progress", *arguments, "builtin_corpus_mb=0.3", "builtin_vocab_size=512",
                     f"cache_dir={workspace['cache']}"]
    if name == "compare_runs":
        for run in (a for a in arguments if not a.startswith("-") and not a.startswith("wandb:")):
            if "/" in run and not Path(run).exists() and not run.endswith(".png"):
                _fake_run(Path(run))
    if name in ("run_study", "study_report"):  # the study file is the repository's, named from its root
        arguments = [str(ROOT / a) if not Path(a).exists() and (ROOT / a).is_file() else a for a in arguments]
    if name == "run_study" and "--list" not in arguments:
        _run_script(target, arguments, monkeypatch, parse_only=True)
        return "parsed (GPU runs)"
    if name == "study_report":  # it rewrites docs/study.md and docs/images: a copy and a scratch folder instead
        copy = workspace["root"] / "docs" / "study.md"
        copy.parent.mkdir(exist_ok=True)
        copy.write_text((ROOT / "docs" / "study.md").read_text())
        arguments = arguments + ["--doc", str(copy), "--images", str(workspace["root"] / "docs" / "images")]
    if name == "bench_checkpoint_verify":  # 10 MB in the scratch folder instead of 3 GB in /tmp
        arguments = arguments + ["--gb", "0.01", "--dir", str(workspace["root"])]
    if name == "bench_loader":
        arguments = arguments + ["--tokens", "2e5", "--shards", "2", "--seq-len", "256", "--seconds", "0.05"]
    _, status = _run_script(target, arguments, monkeypatch, parse_only=False)
    # bench_loader exits 1 when this machine reads below its speed bar: a measurement, not a failure
    assert status in ((0, 1) if name == "bench_loader" else (0,)), f"{command} ended with status {str(status)[:500]}"
    return "ran"


def _check_install(words: list) -> str:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ci = (ROOT / ".ci" / "run").read_text()
    for word in words[2:]:
        if word.startswith("-") or word.startswith("http"):
            continue
        local = re.fullmatch(r"\.(?:\[([\w,]+)\])?", word)
        if local:
            assert all(extra in extras for extra in (local.group(1) or "").split(",") if extra), word
        elif "==" in word:
            assert word in ci, f"{word}: CI installs another version (.ci/run)"
    return "install checked"


def _check_pytest(arguments: list) -> str:
    import tomllib

    markers = [m.split(":")[0] for m in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]]
    words = iter(arguments)
    for word in words:
        if word == "-m":
            expression = next(words)
            assert all(m in markers for m in re.findall(r"\w+", expression) if m not in ("and", "or", "not")), expression
        elif word == "-k":
            next(words)  # a keyword expression, not a path
        elif not word.startswith("-"):
            path, _, node = word.partition("::")  # a file, or a node id: file::test_name[params]
            assert (ROOT / path).exists(), word
            if node:
                test_name = node.split("::")[-1].split("[")[0]
                assert f"def {test_name}(" in (ROOT / path).read_text(), f"{word}: no test {test_name} in {path}"
    return "pytest arguments checked"


# ----------------------------------------------------------------------------------- tests
def test_the_docs_have_commands_and_every_one_has_a_rule():
    assert len(ALL_COMMANDS) > 30
    documents = {command.document for command in ALL_COMMANDS}
    assert {"README.md", "docs/data.md", "docs/reporting.md"} <= documents
    for command in ALL_COMMANDS:
        program = command.text.split()[0]
        assert re.fullmatch(r"[A-Z_]+=\S+", program) or program in ("python", "python3", "torchrun", "pip", "pytest",
                                                                   "sbatch", "export"), f"no rule for {command}"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_command_runs_as_written(document, workspace, monkeypatch):
    monkeypatch.chdir(workspace["work"])
    done = []
    for index, command in enumerate(c for c in ALL_COMMANDS if c.document == document):
        try:
            done.append(f"{command}  -> {handle(command, workspace, monkeypatch, index)}")
        except BaseException as error:  # noqa: BLE001 - name the command whatever failed
            raise AssertionError(f"{command}\nfailed: {type(error).__name__}: {error}") from error
    print("\n".join(done))


def test_messages_and_shipped_files_name_commands_an_installed_wheel_has():
    """What the packages print (their string literals, docstrings aside), the configs and the SLURM launcher the
    wheel ships name `python -m` commands, never a scripts/ path: the wheel carries no scripts/, and a message
    pointing there fails everyone who installed it (the preflight once said `scripts/plan_run.py ...`)."""
    import ast

    found = []
    for package in ("trainer", "models", "data", "fileio", "reports", "benchmarks", "study"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}  # attributes' too
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.strip()[:120]}" for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str) and "scripts/" in node.value
                      and id(node) not in docstrings]
    for path in [*(ROOT / "configs").rglob("*.yaml"), ROOT / "trainer" / "slurm_train.sh"]:
        found += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                  for number, line in enumerate(path.read_text().splitlines(), 1) if "scripts/" in line]
    assert not found, "\n".join(found)
    for module in INSTALLED_COMMANDS:  # each is a module the packages hold, with a main()
        assert callable(getattr(_load_script(module), "main", None)), module


def test_the_readme_gives_the_cpu_build_of_torch_before_anything_a_reader_pip_installs():
    """Read top to bottom, the README's first install is PyTorch's CPU build: `pip install -e .` before it would
    have pulled the CUDA build (several GB) onto a CPU-only machine."""
    commands = [command for command in ALL_COMMANDS if command.document == "README.md"]
    installs = [command for command in commands if command.text.startswith("pip install")]
    assert "--index-url https://download.pytorch.org/whl/cpu" in installs[0].text and "torch==" in installs[0].text
    assert installs[1].text == "pip install -e ." and installs[1].line == installs[0].line + 1
