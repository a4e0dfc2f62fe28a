"""Compare the loss curves of training runs: align on tokens, plot, and print the relative difference.

`compare_runs(specs, ...)` reads the runs, compares each with the first, prints the table, draws
the figure and returns the numbers (`python -m reports.compare_runs`, this package's __main__, is its command line).

The first run is the reference; every other run is compared with it. Each RUN is
  - a run directory holding ``metrics.jsonl`` (what the trainer writes), or a ``metrics.jsonl`` path;
  - else a directory with a W&B history file, ``wandb/run-*/files/wandb-history.jsonl`` or
    ``files/wandb-history.jsonl`` (keys ``tokens``, ``train/loss``, ``train/lr``, ``val/loss``).
    Offline W&B runs keep their history only in the binary ``run-*.wandb`` file, which this tool does
    not read: it says so and points at metrics.jsonl or ``wandb sync`` + ``--wandb-online``;
  - ``wandb:entity/project/run_id`` with ``--wandb-online`` (read through ``wandb.Api``).
A metrics.jsonl line is a JSON object with at least ``tokens`` and ``loss``; ``lr`` and ``val_loss``
are used when present; "nan"/"inf" strings (how the trainer writes non-finite values) are read as
such and dropped from the curves. A step logged twice (a run resumed from an earlier checkpoint
appends again) keeps its last line.

Method:
  1. Smoothing (--smooth, per run, on its own points, before alignment): ``none``, ``ema:B``
     (s_i = B s_(i-1) + (1 - B) x_i, s_0 = x_0; trailing) or ``window:N`` (centred mean of N points,
     shrinking at the ends). Both are linear, so B = c A stays B = c A after smoothing. Only the
     training loss is smoothed; val_loss (--val) is compared as logged.
  2. Alignment: A's token grid over the overlap of A and B; B linearly interpolated onto it
     (``numpy.interp``). No extrapolation: points outside the overlap are not compared.
  3. Relative difference r(t) = (B(t) - A(t)) / A(t).
  4. Phases from each run's own ``lr`` column: the stable phase runs from the first to the last point
     where lr is at its maximum (within 1e-6 relative; warm-up excluded), the decay phase after that
     last point. ``--decay-start-tokens`` / ``--stable-start-tokens`` override (for every run).
     Without an lr column the stable phase is the whole overlap and there is no decay phase. Runs of
     different schedules (a 30-step reference against a 200-step run) have different phases: a point
     of B's comparison counts in a phase where both A and B are in it, and each run's phases are printed.
  5. Printed: the mean of r over each phase's grid points and r at the last common point, per B.
     With --val, a B whose validation points do not overlap A's (validation at other steps) is named
     and left out of the val_loss comparison.
  6. Noise band (--noise RUN): a run that differs from A only by its seed (A's "twin"). Its own
     relative difference n(t) to A, after the same smoothing, is drawn as the band +-|n(t)| around
     0, and each phase's mean |n| is printed beside the runs' means: a difference inside the band
     is not distinguishable from seed-to-seed variation at this scale.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

HISTORY_FILE = "wandb-history.jsonl"
METRICS_FILE = "metrics.jsonl"
WANDB_PREFIX = "wandb:"
LR_AT_MAX_TOLERANCE = 1e-6


@dataclass
class Run:
    """One run's logged points, sorted by step (or by order of appearance when there is no step)."""

    label: str
    source: str
    records: List[dict]
    notes: List[str] = field(default_factory=list)

    def series(self, key: str) -> Tuple[np.ndarray, np.ndarray]:
        """(tokens, values) of the points that have a finite ``key`` and finite tokens, in order."""
        tokens, values = [], []
        for record in self.records:
            token, value = _number(record.get("tokens")), _number(record.get(key))
            if token is not None and value is not None and math.isfinite(token) and math.isfinite(value):
                tokens.append(token)
                values.append(value)
        return np.asarray(tokens, dtype=np.float64), np.asarray(values, dtype=np.float64)

    def has(self, key: str) -> bool:
        return self.series(key)[0].size > 0


def _number(value) -> Optional[float]:
    """JSON value -> float ('nan', 'inf' strings included); None when absent or not a number."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


# ------------------------------------------------------------------------------------ reading runs
def read_jsonl(path: Path, key_map: Optional[Dict[str, str]] = None) -> List[dict]:
    """Records of a JSONL file; keys renamed by ``key_map``; a bad line is an error naming file and line."""
    records = []
    with open(path) as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON line ({error.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
            if key_map:
                record = {key_map.get(k, k): v for k, v in record.items()}
            records.append(record)
    return records


def _history_key_map(keys) -> Dict[str, str]:
    """W&B history keys -> metrics.jsonl keys: 'train/loss' -> 'loss', 'val/loss' (or the older
    'train/val_loss') -> 'val_loss', '_step' -> 'step' (if no 'step')."""
    mapping = {key: key[len("train/"):] for key in keys if key.startswith("train/")}
    if "val/loss" in keys:
        mapping["val/loss"] = "val_loss"
    if "step" not in keys:
        mapping["_step"] = "step"
    return mapping


def keep_last_per_step(records: List[dict]) -> List[dict]:
    """One record per step (the last one written), sorted by step; records without a step keep their order.

    A partial line (``"partial": true``, written at a stop between log steps) is dropped when a later
    line follows it: the trainer checkpoints the window in progress, so the next line after the
    resume averages those steps again. A partial line at the end of a log (a run stopped for good) stays.
    """
    if not records or any(_number(r.get("step")) is None for r in records):
        return records
    by_step: Dict[float, dict] = {}
    for record in records:
        by_step[_number(record["step"])] = record
    ordered = [by_step[step] for step in sorted(by_step)]
    return [record for index, record in enumerate(ordered)
            if not (record.get("partial") is True and index < len(ordered) - 1)]


def _find_history(directory: Path) -> Optional[Path]:
    candidates = sorted(directory.glob(f"files/{HISTORY_FILE}")) + sorted(directory.glob(f"wandb/*run-*/files/{HISTORY_FILE}"))
    candidates += sorted(directory.glob(f"*run-*/files/{HISTORY_FILE}"))
    return candidates[-1] if candidates else None


def load_run(spec: str, label: Optional[str] = None, wandb_online: bool = False) -> Run:
    """Read one run (see the module docstring for what ``spec`` may be)."""
    if spec.startswith(WANDB_PREFIX):
        if not wandb_online:
            raise ValueError(f"{spec}: reading W&B runs online needs --wandb-online")
        return _load_wandb_online(spec[len(WANDB_PREFIX):], label)
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"run {spec!r} does not exist")
    if path.is_file():
        key_map = None
        if path.name == HISTORY_FILE:
            with open(path) as handle:
                first = next((line for line in handle if line.strip()), "{}")
            key_map = _history_key_map(json.loads(first).keys())
        records = keep_last_per_step(read_jsonl(path, key_map))
        default_label = path.parent.name if path.name in (METRICS_FILE, HISTORY_FILE) else path.stem
        return _checked(Run(label or default_label, str(path), records))
    metrics = path / METRICS_FILE
    if metrics.is_file():
        return _checked(Run(label or path.name, str(metrics), keep_last_per_step(read_jsonl(metrics))))
    history = _find_history(path)
    if history is not None:
        with open(history) as handle:
            first = next((line for line in handle if line.strip()), "{}")
        records = keep_last_per_step(read_jsonl(history, _history_key_map(json.loads(first).keys())))
        return _checked(Run(label or path.name, str(history), records))
    binaries = sorted(path.glob("**/*.wandb"))
    if binaries:
        raise ValueError(
            f"{spec}: only W&B binary run files found ({binaries[0]}); offline runs keep their history in that "
            f"format, which this tool does not read. Use the run directory's {METRICS_FILE}, or `wandb sync` the run "
            f"and pass wandb:entity/project/run_id with --wandb-online"
        )
    raise FileNotFoundError(f"{spec}: no {METRICS_FILE} and no W&B {HISTORY_FILE} found in this directory")


def _load_wandb_online(path: str, label: Optional[str]) -> Run:
    try:
        import wandb
    except ImportError as error:
        raise RuntimeError(f"--wandb-online needs the wandb package ({error})") from None
    if path.count("/") != 2:
        raise ValueError(f"wandb:{path}: expected wandb:entity/project/run_id")
    run = wandb.Api().run(path)
    rows = list(run.scan_history())
    keys = set().union(*(row.keys() for row in rows)) if rows else set()
    mapping = _history_key_map(keys)
    records = keep_last_per_step([{mapping.get(k, k): v for k, v in row.items()} for row in rows])
    return _checked(Run(label or run.name or path, f"wandb:{path}", records))


def _checked(run: Run) -> Run:
    if not run.records:
        raise ValueError(f"{run.source}: no records")
    if not run.has("tokens"):
        raise ValueError(f"{run.source}: no 'tokens' field in any record (needed to align runs)")
    if not run.has("loss"):
        raise ValueError(f"{run.source}: no finite 'loss' values")
    dropped = sum(1 for r in run.records if "loss" in r and not finite(r.get("loss")))
    if dropped:
        run.notes.append(f"{dropped} non-finite loss value(s) dropped")
    return run


def finite(value) -> bool:
    """A JSON value that is a finite number ('nan'/'inf' strings and absent values are not)."""
    number = _number(value)
    return number is not None and math.isfinite(number)


# ------------------------------------------------------------------------------------ smoothing
def smooth(values: np.ndarray, spec: str) -> np.ndarray:
    """Smooth a series: 'none', 'ema:B' (0 <= B < 1, trailing, s_0 = x_0) or 'window:N' (centred mean)."""
    spec = (spec or "none").strip().lower()
    if spec == "none" or values.size == 0:
        return values.copy()
    kind, _, argument = spec.partition(":")
    if kind == "ema":
        try:
            beta = float(argument)
        except ValueError:
            raise ValueError(f"--smooth {spec!r}: expected ema:B with 0 <= B < 1") from None
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"--smooth {spec!r}: the EMA weight must be in [0, 1)")
        out = np.empty_like(values)
        out[0] = values[0]
        for i in range(1, values.size):
            out[i] = beta * out[i - 1] + (1.0 - beta) * values[i]
        return out
    if kind == "window":
        try:
            width = int(argument)
        except ValueError:
            raise ValueError(f"--smooth {spec!r}: expected window:N with N >= 1") from None
        if width < 1:
            raise ValueError(f"--smooth {spec!r}: the window must be >= 1 point")
        half_before, half_after = (width - 1) // 2, width // 2
        cumulative = np.concatenate([[0.0], np.cumsum(values)])
        index = np.arange(values.size)
        start = np.maximum(index - half_before, 0)
        stop = np.minimum(index + half_after + 1, values.size)
        return (cumulative[stop] - cumulative[start]) / (stop - start)
    raise ValueError(f"--smooth {spec!r}: expected none, ema:B or window:N")


# ------------------------------------------------------------------------------------ comparison
def smoothing_for(metric: str, smoothing: str) -> str:
    """Smoothing applies to the training loss; validation losses are already averages over batches."""
    return smoothing if metric == "loss" else "none"


@dataclass
class Phases:
    """Token ranges of the reference run's schedule: stable [stable_start, decay_start], decay (decay_start, end]."""

    stable_start: float
    decay_start: Optional[float]
    """Tokens of the last point at the maximum lr; None: no decay phase."""
    source: str

    def stable(self, tokens: np.ndarray) -> np.ndarray:
        upper = np.inf if self.decay_start is None else self.decay_start
        return (tokens >= self.stable_start) & (tokens <= upper)

    def decay(self, tokens: np.ndarray) -> np.ndarray:
        if self.decay_start is None:
            return np.zeros_like(tokens, dtype=bool)
        return tokens > self.decay_start

    def same_as(self, other: "Phases") -> bool:
        return self.stable_start == other.stable_start and self.decay_start == other.decay_start

    def describe(self) -> str:
        decay = "none" if self.decay_start is None else f"after {self.decay_start:.4g} tokens"
        return f"stable from {self.stable_start:.4g} tokens, decay {decay}"


@dataclass
class PairPhases:
    """The phases of a comparison of two runs: a point is in a phase where both runs' schedules are."""

    first: Phases
    second: Phases

    def stable(self, tokens: np.ndarray) -> np.ndarray:
        return self.first.stable(tokens) & self.second.stable(tokens)

    def decay(self, tokens: np.ndarray) -> np.ndarray:
        return self.first.decay(tokens) & self.second.decay(tokens)


class NoOverlap(ValueError):
    """Two runs' points of one metric share no token range (validation at other steps, say)."""


def detect_phases(run: Run, decay_start_tokens: Optional[float] = None,
                  stable_start_tokens: Optional[float] = None) -> Phases:
    """Stable and decay phases from the run's lr column (or the overrides)."""
    tokens, lr = run.series("lr")
    stable_start, decay_start, source = None, None, f"from {run.label}'s lr"
    if lr.size:
        peak = lr.max()
        at_max = np.nonzero(lr >= peak * (1 - LR_AT_MAX_TOLERANCE))[0]
        stable_start = tokens[at_max[0]]
        if at_max[-1] < lr.size - 1:  # lr drops after its last point at the maximum
            decay_start = tokens[at_max[-1]]
    else:
        source = f"no lr column in {run.label}: one stable phase"
    if stable_start_tokens is not None:
        stable_start, source = float(stable_start_tokens), "given"
    if decay_start_tokens is not None:
        decay_start, source = float(decay_start_tokens), "given"
    if stable_start is None:
        stable_start = -np.inf
    return Phases(stable_start, decay_start, source)


@dataclass
class Comparison:
    """B against A for one metric over A's token grid in the overlap."""

    label: str
    metric: str
    tokens: np.ndarray
    reference: np.ndarray
    other: np.ndarray
    relative: np.ndarray
    """(B - A) / A at each grid point."""
    stable_mean: Optional[float]
    decay_mean: Optional[float]
    final: Optional[float]
    points: int


def align(tokens_a: np.ndarray, values_a: np.ndarray, tokens_b: np.ndarray, values_b: np.ndarray,
          names: Tuple[str, str] = ("A", "B"), what: str = "points") -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A's points inside the overlap of both token ranges, and B linearly interpolated there (NoOverlap if none)."""
    if tokens_a.size == 0 or tokens_b.size == 0:
        raise ValueError(f"nothing to align: {names[0]} has {tokens_a.size} points, {names[1]} {tokens_b.size}")
    order_b = np.argsort(tokens_b, kind="stable")
    tokens_b, values_b = tokens_b[order_b], values_b[order_b]
    low, high = max(tokens_a.min(), tokens_b.min()), min(tokens_a.max(), tokens_b.max())
    inside = (tokens_a >= low) & (tokens_a <= high)
    if not inside.any():
        raise NoOverlap(
            f"the {what} of {names[0]} (tokens {tokens_a.min():.4g}..{tokens_a.max():.4g}, {tokens_a.size}) and "
            f"{names[1]} (tokens {tokens_b.min():.4g}..{tokens_b.max():.4g}, {tokens_b.size}) do not overlap"
        )
    grid = tokens_a[inside]
    return grid, values_a[inside], np.interp(grid, tokens_b, values_b)


def compare(run_a: Run, run_b: Run, metric: str, phases, smoothing: str = "none") -> Comparison:
    """B against A on A's grid; ``phases`` (Phases or PairPhases) picks each phase's points."""
    tokens_a, values_a = run_a.series(metric)
    tokens_b, values_b = run_b.series(metric)
    smoothing = smoothing_for(metric, smoothing)
    values_a, values_b = smooth(values_a, smoothing), smooth(values_b, smoothing)
    what = {"loss": "training loss points", "val_loss": "validation points"}.get(metric, f"{metric} points")
    grid, reference, other = align(tokens_a, values_a, tokens_b, values_b, (run_a.label, run_b.label), what)
    if np.any(reference == 0):
        raise ValueError(f"{run_a.label}: {metric} is 0 at some point; the relative difference is undefined there")
    relative = (other - reference) / reference

    def mean(mask):
        return float(relative[mask].mean()) if mask.any() else None

    return Comparison(
        label=run_b.label, metric=metric, tokens=grid, reference=reference, other=other, relative=relative,
        stable_mean=mean(phases.stable(grid)), decay_mean=mean(phases.decay(grid)),
        final=float(relative[-1]), points=int(grid.size),
    )


def noise_band(comparison: Comparison, phases) -> dict:
    """Mean |relative difference| of a seed twin per phase, and at the last point."""
    magnitude = np.abs(comparison.relative)

    def mean(mask):
        return float(magnitude[mask].mean()) if mask.any() else None

    return {"stable_mean": mean(phases.stable(comparison.tokens)), "decay_mean": mean(phases.decay(comparison.tokens)),
            "final": float(magnitude[-1])}


# ------------------------------------------------------------------------------------ plotting
def plot(runs: List[Run], comparisons: Dict[str, List[Comparison]], phases: List[Phases], smoothing: str,
         out: Path, noise: Optional[Dict[str, Comparison]] = None, title: Optional[str] = None) -> Path:
    """Loss curves and relative differences (one pair of panels per metric) to a PNG; ``phases`` per run:
    one grey decay span where all runs agree, else each run's in its colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, PercentFormatter

    metrics = list(comparisons)
    end = max(run.series("loss")[0].max() for run in runs)
    figure, axes = plt.subplots(2 * len(metrics), 1, figsize=(10, 4.2 * len(metrics) + 1.5), sharex=True,
                                squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, metric in enumerate(metrics):
        curve_axis, diff_axis = axes[2 * row, 0], axes[2 * row + 1, 0]
        metric_smoothing = smoothing_for(metric, smoothing)
        shown = []
        for index, run in enumerate(runs):
            tokens, values = run.series(metric)
            if tokens.size == 0:
                continue
            color = colors[index % len(colors)]
            smoothed = smooth(values, metric_smoothing)
            if metric_smoothing != "none":
                curve_axis.plot(tokens, values, color=color, alpha=0.2, linewidth=0.8)
            curve_axis.plot(tokens, smoothed, color=color, linewidth=1.4, label=run.label)
            shown.append(smoothed[tokens >= 0.05 * end] if (tokens >= 0.05 * end).any() else smoothed)
        if shown:  # the first 5% of tokens (the steep start) would squash the interesting range
            low, high = min(v.min() for v in shown), max(v.max() for v in shown)
            pad = 0.05 * (high - low) if high > low else 0.05 * abs(high) + 1e-9
            curve_axis.set_ylim(low - pad, high + pad)
        curve_axis.set_ylabel(metric)
        curve_axis.legend(loc="upper right")
        curve_axis.grid(alpha=0.3)
        curve_axis.set_title(f"{metric}" + (f" (smoothed {metric_smoothing})" if metric_smoothing != "none" else ""))
        for index, comparison in enumerate(comparisons[metric], start=1):
            diff_axis.plot(comparison.tokens, comparison.relative, color=colors[index % len(colors)], linewidth=1.2,
                           label=f"({comparison.label} - {runs[0].label}) / {runs[0].label}")
        if noise and metric in noise:
            band = np.abs(noise[metric].relative)
            diff_axis.fill_between(noise[metric].tokens, -band, band, color="black", alpha=0.12, linewidth=0,
                                   label=f"seed noise: +-|{noise[metric].label} - {runs[0].label}| / {runs[0].label}")
        diff_axis.axhline(0.0, color="black", linewidth=0.8)
        diff_axis.yaxis.set_major_formatter(PercentFormatter(1.0))
        diff_axis.set_ylabel(f"relative {metric} difference")
        diff_axis.legend(loc="upper left")
        diff_axis.grid(alpha=0.3)
        same = all(p.same_as(phases[0]) for p in phases)
        for axis in (curve_axis, diff_axis):
            for index, (run, own) in enumerate(zip(runs, phases[:1] if same else phases)):
                if own.decay_start is not None:
                    color = "grey" if same else colors[index % len(colors)]
                    run_end = end if same else run.series("loss")[0].max()
                    axis.axvspan(own.decay_start, run_end, color=color, alpha=0.12 if same else 0.08, linewidth=0)
                    axis.axvline(own.decay_start, color=color, linestyle="--", linewidth=0.8)
    if title:
        figure.suptitle(title)
    axes[-1, 0].xaxis.set_major_formatter(EngFormatter())
    decaying = [p for p in phases if p.decay_start is not None]
    shaded = "" if not decaying else " (shaded: lr decay)" if same else " (shaded: each run's lr decay, in its colour)"
    axes[-1, 0].set_xlabel("tokens" + shaded)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


# ------------------------------------------------------------------------------------ W&B report
def log_to_wandb(figure_path: Path, summary: dict, project: str, mode: str, name: Optional[str]) -> str:
    """Log the figure and the numbers to a new W&B run (offline unless mode='online'); returns its directory."""
    import wandb

    run = wandb.init(project=project, name=name, job_type="compare_runs", mode=mode, dir=str(figure_path.parent),
                     config={"runs": summary["runs"], "smoothing": summary["smoothing"]},
                     settings=wandb.Settings(silent=True, console="off"))
    try:
        run.log({"compare_runs/figure": wandb.Image(str(figure_path))})
        flat = {}
        for metric, entries in summary["metrics"].items():
            for entry in entries:
                for phase in ("stable_mean", "decay_mean", "final"):
                    if entry[phase] is not None:
                        flat[f"compare_runs/{metric}/{entry['run']}/{phase}"] = entry[phase]
        run.summary.update(flat)
        return str(run.dir)
    finally:
        run.finish()


# ------------------------------------------------------------------------------------ the comparison
def percent(value: Optional[float]) -> str:
    """A relative difference as printed: '+1.000%', or 'n/a' where a phase has no points."""
    return "n/a" if value is None else f"{100 * value:+.3f}%"


def compare_runs(specs: Sequence[str], labels: Optional[Sequence[str]] = None, smoothing: str = "none",
                 out: Path = Path("compare_runs.png"), val: bool = False, decay_start_tokens: Optional[float] = None,
                 stable_start_tokens: Optional[float] = None, noise: Optional[str] = None, title: Optional[str] = None,
                 json_path: Optional[Path] = None, wandb_online: bool = False, wandb_report: bool = False,
                 wandb_mode: str = "offline", wandb_project: str = "hybrid-nvfp4",
                 echo: Callable[[str], None] = print) -> dict:
    """Compare every run of ``specs`` with the first: print the table through ``echo``, write the figure
    to ``out`` (and the numbers to ``json_path``, and both to a W&B run with ``wandb_report``); returns
    the numbers (the JSON's content, plus 'figure' and 'wandb_dir')."""
    if len(specs) < 2:
        raise ValueError("give at least two runs (the first is the reference)")
    if labels is not None and len(labels) != len(specs):
        raise ValueError(f"--labels has {len(labels)} entries for {len(specs)} runs")
    smooth(np.zeros(1), smoothing)  # a bad --smooth fails here, before any work
    runs = [load_run(str(spec), label, wandb_online) for spec, label in zip(specs, labels or [None] * len(specs))]
    seen = {}
    for run in runs:  # unique labels for the legend and the summary
        count = seen.get(run.label, 0)
        seen[run.label] = count + 1
        if count:
            run.label = f"{run.label}#{count + 1}"
    reference = runs[0]
    run_phases = [detect_phases(run, decay_start_tokens, stable_start_tokens) for run in runs]  # each its own
    phases = run_phases[0]
    pairs = [PairPhases(phases, own) for own in run_phases[1:]]

    metrics = ["loss"]
    if val:
        if all(run.has("val_loss") for run in runs):
            metrics.append("val_loss")
        else:
            missing = [run.label for run in runs if not run.has("val_loss")]
            echo(f"note: --val skipped: no val_loss in {missing}")
    comparisons = {"loss": [compare(reference, run, "loss", pair, smoothing) for run, pair in zip(runs[1:], pairs)]}
    if "val_loss" in metrics:
        entries = []
        for run, pair in zip(runs[1:], pairs):
            try:
                entries.append(compare(reference, run, "val_loss", pair, smoothing))
            except NoOverlap as apart:  # validation at other steps: the training loss still compares
                echo(f"note: --val: {apart}: validation ran at other steps; {run.label}'s val_loss is not compared")
        if entries:
            comparisons["val_loss"] = entries
        else:
            metrics.remove("val_loss")
    noise_comparisons: Dict[str, Comparison] = {}
    if noise is not None:
        noise_run = load_run(str(noise), None, wandb_online)
        noise_run.label = f"{noise_run.label} (noise)" if noise_run.label in seen else noise_run.label
        noise_pair = PairPhases(phases, detect_phases(noise_run, decay_start_tokens, stable_start_tokens))
        noise_comparisons = {metric: compare(reference, noise_run, metric, noise_pair, smoothing)
                             for metric in metrics if noise_run.has(metric)}

    for index, run in enumerate(runs):
        tokens, _ = run.series("loss")
        role = "A (reference)" if index == 0 else "B"
        notes = f"; {'; '.join(run.notes)}" if run.notes else ""
        echo(f"{role} {run.label}: {run.source}, {tokens.size} loss points, tokens {tokens.min():.4g} .. "
             f"{tokens.max():.4g}{notes}")
    if all(own.same_as(phases) for own in run_phases):
        echo(f"phases ({phases.source}{', the same in every run' if len(runs) > 1 else ''}): {phases.describe()}")
    else:  # a reference of another length or schedule: its phases are not B's
        echo("phases differ between the runs (each from its own lr); a phase's mean counts the points where both "
             "runs of a comparison are in that phase:")
        for run, own in zip(runs, run_phases):
            echo(f"  {run.label}: {own.describe()}")

    def phase_record(own: Phases) -> dict:
        return {"stable_start_tokens": float(own.stable_start) if math.isfinite(own.stable_start) else None,
                "decay_start_tokens": own.decay_start, "source": own.source}

    summary = {"runs": [{"label": r.label, "source": r.source} for r in runs], "smoothing": smoothing,
               "phases": {**phase_record(phases),
                          "per_run": {run.label: phase_record(own) for run, own in zip(runs, run_phases)}},
               "metrics": {}}
    for metric, entries in comparisons.items():
        echo(f"\n{metric}: relative difference (B - {reference.label}) / {reference.label}, "
             f"smoothing {smoothing_for(metric, smoothing)}")
        width = max(len("run"), *(len(c.label) for c in entries))
        echo(f"  {'run'.ljust(width)}  {'stable mean':>12}  {'decay mean':>12}  {'final':>12}  points")
        for c in entries:
            echo(f"  {c.label.ljust(width)}  {percent(c.stable_mean):>12}  {percent(c.decay_mean):>12}  "
                 f"{percent(c.final):>12}  {c.points}")
        if metric in noise_comparisons:
            twin = noise_comparisons[metric]
            band = noise_band(twin, noise_pair)
            echo(f"  {'noise +-'.ljust(width)}  {percent(band['stable_mean']):>12}  {percent(band['decay_mean']):>12}  "
                 f"{percent(band['final']):>12}  (mean |{twin.label} - {reference.label}| / {reference.label})")
            summary.setdefault("noise", {})[metric] = {"run": twin.label, **band}
        summary["metrics"][metric] = [
            {"run": c.label, "stable_mean": c.stable_mean, "decay_mean": c.decay_mean, "final": c.final,
             "points": c.points} for c in entries
        ]
    figure = plot(runs, comparisons, run_phases, smoothing, out, noise_comparisons, title)
    summary["figure"] = str(figure)
    echo(f"\nwrote {figure}")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2) + "\n")
        echo(f"wrote {json_path}")
    if wandb_report:
        name = "compare: " + " vs ".join(run.label for run in runs)
        directory = log_to_wandb(figure, summary, wandb_project, wandb_mode, name)
        summary["wandb_dir"] = directory
        echo(f"logged the figure to W&B ({wandb_mode}): {directory}")
    return summary
