"""A study: arms x seeds x sizes, defined in one YAML file, expanded into runs.

    name: precision
    reference: bf16                # the arm every gap is measured against, paired by seed
    seeds: [0, 1, 2]
    seed_overrides: ["seed={seed}", "precision.seed={seed}"]   # how a seed enters a run's command
    sizes:                         # model sizes; each names the arms it runs ("all" or a list)
      9m: {overrides: [], about: "...", arms: all}
      37m: {overrides: [model.hidden_size=512, ...], arms: [bf16, nvfp4], seeds: [0, 1, 2]}
    arms:                          # what differs between runs of one size and seed
      bf16: {experiment: study_bf16, overrides: [], about: "..."}
    comparisons:                   # arm-vs-arm differences the report tabulates (first minus second)
      - [nvfp4_no_sr, nvfp4]
    figures:                       # report figures: name -> arms drawn against the reference
      main: [fp8, nvfp4]

A run is one (size, arm, seed); its id is ``<size>/<arm>/seed<k>`` and its results live in that
folder under the study's results root (the YAML file's folder). Its command is
``python -m trainer +experiment=<arm.experiment> <size.overrides> <arm.overrides> <seed overrides>``:
later overrides win, so an arm can still override a size's setting.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from pathlib import Path
from typing import Optional, Sequence

import yaml


@dataclasses.dataclass(frozen=True)
class StudyRun:
    """One run of a study: an arm of one size at one seed."""

    size: str
    arm: str
    seed: int
    experiment: str
    overrides: tuple[str, ...]
    """Trainer overrides after +experiment=: the size's, the arm's, then the seed's."""
    about: str = ""

    @property
    def id(self) -> str:
        return f"{self.size}/{self.arm}/seed{self.seed}"

    def trainer_arguments(self) -> list[str]:
        """The arguments of `python -m trainer` for this run (without run directory or machine settings)."""
        return [f"+experiment={self.experiment}", *self.overrides]


@dataclasses.dataclass(frozen=True)
class Study:
    """A parsed study file (see the module docstring)."""

    name: str
    reference: str
    seeds: tuple[int, ...]
    seed_overrides: tuple[str, ...]
    sizes: dict
    arms: dict
    comparisons: tuple[tuple[str, str], ...] = ()
    figures: dict = dataclasses.field(default_factory=dict)
    path: Optional[Path] = None

    @property
    def results(self) -> Path:
        """Where run folders live: the study file's folder."""
        return self.path.parent if self.path is not None else Path(".")

    def runs(self) -> list[StudyRun]:
        """Every run, sizes in file order, then arms in file order, then seeds."""
        expanded = []
        for size, spec in self.sizes.items():
            arms = list(self.arms) if spec.get("arms", "all") == "all" else list(spec["arms"])
            for arm in arms:
                arm_spec = self.arms[arm]
                for seed in spec.get("seeds", self.seeds):
                    expanded.append(StudyRun(
                        size=size, arm=arm, seed=int(seed), experiment=arm_spec["experiment"],
                        overrides=(*spec.get("overrides", []), *arm_spec.get("overrides", []),
                                   *(template.format(seed=seed) for template in self.seed_overrides)),
                        about=arm_spec.get("about", "")))
        return expanded

    def select(self, patterns: Sequence[str] = ()) -> list[StudyRun]:
        """The runs whose id matches any of the shell-style patterns (all runs when none is given), in the
        patterns' order (the study file's within one pattern): the runner starts them in that order, so
        `19m/nvfp4/seed0 '3m/*'` starts the long run first and the short ones fill in beside it."""
        runs = self.runs()
        if not patterns:
            return runs

        def first_pattern(run: StudyRun) -> Optional[int]:
            return next((i for i, pattern in enumerate(patterns) if fnmatch.fnmatchcase(run.id, pattern)), None)

        chosen = sorted((run for run in runs if first_pattern(run) is not None), key=first_pattern)
        unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(run.id, p) for run in runs)]
        if unmatched:
            raise ValueError(f"no run of study {self.name!r} matches {', '.join(map(repr, unmatched))}; "
                             f"run ids look like {runs[0].id!r}")
        return chosen


def load_study(path: Path) -> Study:
    """Parse and check a study file; errors name the file and the field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ValueError(f"cannot read study file {path}: {error.strerror}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a study file is a mapping with name, reference, seeds, sizes, arms")
    missing = [key for key in ("name", "reference", "seeds", "sizes", "arms") if key not in raw]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    unknown = set(raw) - {"name", "reference", "seeds", "seed_overrides", "sizes", "arms", "comparisons", "figures"}
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    arms, sizes = raw["arms"], raw["sizes"]
    if not isinstance(arms, dict) or not arms:
        raise ValueError(f"{path}: arms must be a non-empty mapping of name -> {{experiment, overrides, about}}")
    if not isinstance(sizes, dict) or not sizes:
        raise ValueError(f"{path}: sizes must be a non-empty mapping of name -> {{overrides, arms}}")
    for name, arm in arms.items():
        if not isinstance(arm, dict) or "experiment" not in arm:
            raise ValueError(f"{path}: arm {name!r} needs an experiment")
        if not isinstance(arm.get("overrides", []), list):
            raise ValueError(f"{path}: arm {name!r}: overrides must be a list")
    if raw["reference"] not in arms:
        raise ValueError(f"{path}: reference {raw['reference']!r} is not an arm ({', '.join(arms)})")
    for name, size in sizes.items():
        if "/" in str(name) or not isinstance(size, dict):
            raise ValueError(f"{path}: size {name!r} must be a mapping and its name free of '/'")
        chosen = size.get("arms", "all")
        if chosen != "all":
            strays = [arm for arm in chosen if arm not in arms]
            if strays:
                raise ValueError(f"{path}: size {name!r} names unknown arm(s) {', '.join(strays)}")
    seeds = tuple(int(seed) for seed in raw["seeds"])
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError(f"{path}: seeds must be distinct integers, got {raw['seeds']}")
    seed_overrides = tuple(raw.get("seed_overrides", ["seed={seed}"]))
    if not all("{seed}" in template for template in seed_overrides):
        raise ValueError(f"{path}: every seed_overrides entry must contain {{seed}}")
    comparisons = tuple(tuple(pair) for pair in raw.get("comparisons", []))
    for pair in comparisons:
        if len(pair) != 2 or any(arm not in arms for arm in pair):
            raise ValueError(f"{path}: comparison {list(pair)} must name two arms")
    figures = dict(raw.get("figures", {}))
    for figure, members in figures.items():
        strays = [arm for arm in members if arm not in arms]
        if strays:
            raise ValueError(f"{path}: figure {figure!r} names unknown arm(s) {', '.join(strays)}")
    return Study(name=str(raw["name"]), reference=raw["reference"], seeds=seeds, seed_overrides=seed_overrides,
                 sizes=dict(sizes), arms=dict(arms), comparisons=comparisons, figures=figures, path=path)
