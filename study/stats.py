"""A study's numbers: per-run summaries, gaps to the reference paired by seed, and t intervals.

For a run (one arm, one size, one seed), from its metrics.jsonl:
- final validation loss: the val_loss logged at the last step (the same fixed validation batches
  for every run of a study);
- late validation loss: the mean of the val_loss points of the last 30% of training, those at a step s
  with 10 * s > 7 * steps (integers: no floating-point product decides the window; 0.7 * 1400 is
  979.9999999999999). For 1400 steps evaluated every 70: steps 1050-1400, 6 points;
- final train loss: the mean logged training loss over the last 5% of steps (20 * s > 19 * steps).

Growth of a gap in the decay phase, paired by seed: the mean gap over the validation points of the
learning-rate decay (after the WSD schedule's decay start) minus the mean gap over those of the
stable phase (5 * s > steps, past warm-up and the early plateau, up to the decay start).

Gap of an arm to the reference, paired by seed s: g_s = 100 * (L_arm,s / L_ref,s - 1) in %, for the
final and for the late validation loss. A difference between two arms a and b, paired by seed:
d_s = g_a,s - g_b,s in percentage points (= 100 * (L_a,s - L_b,s) / L_ref,s). Both are summarized
over the n seeds present in both by the mean and its 95% confidence interval,
mean +- t_{0.975, n-1} * sd / sqrt(n) (Student's t, sd with n - 1 degrees of freedom; no interval
for n < 2). An effect is "resolved" when its interval excludes zero. At an observed spread sd, the
seeds an interval of half-width w needs: the smallest n with t_{0.975, n-1} * sd / sqrt(n) <= w
(`seeds_for_half_width`).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Optional, Sequence

import yaml

from reports.compare_runs import finite, keep_last_per_step, read_jsonl

LATE_FRACTION = Fraction(7, 10)
"""Validation points after this fraction of the steps make the late validation loss (exact: a Fraction)."""
TRAIN_TAIL_FRACTION = Fraction(19, 20)
"""Training-loss log lines after this fraction of the steps make the final train loss."""


def after_fraction(step: int, steps: int, fraction: Fraction) -> bool:
    """Whether ``step`` lies past ``fraction`` of ``steps``, in integers: step * denominator > steps * numerator.
    (A float product would not do: 0.7 * 1400 == 979.9999999999999 puts step 980 in the last 30%.)"""
    fraction = Fraction(str(fraction)) if isinstance(fraction, float) else Fraction(fraction)  # 0.7 -> 7/10
    return int(step) * fraction.denominator > int(steps) * fraction.numerator


@dataclasses.dataclass(frozen=True)
class Interval:
    """Mean of n paired values with its two-sided confidence interval (nan bounds when n < 2)."""

    mean: float
    low: float
    high: float
    n: int
    sd: float

    @property
    def resolved(self) -> bool:
        """The interval excludes zero."""
        return self.n >= 2 and (self.low > 0 or self.high < 0)

    def verdict(self, above: str = "worse", below: str = "better") -> str:
        if self.n < 2:
            return "one seed"
        return above if self.low > 0 else below if self.high < 0 else "not resolved"

    def format(self, digits: int = 2, unit: str = "") -> str:
        """'+1.23% [+0.45, +2.01]' (the bracket is the 95% CI)."""
        if self.n < 2:
            return f"{self.mean:+.{digits}f}{unit} (n=1)"
        return f"{self.mean:+.{digits}f}{unit} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def seeds_for_half_width(sd: float, half_width: float, confidence: float = 0.95, most: int = 1000) -> Optional[int]:
    """The fewest seeds n >= 2 whose t interval of the mean is at most +-``half_width`` at spread ``sd``:
    t_{(1 + confidence) / 2, n - 1} * sd / sqrt(n) <= half_width (the sd taken as known; a new sample's
    own sd varies around it). None if more than ``most`` would be needed."""
    from scipy.stats import t as student_t

    if not sd > 0:
        return 2
    for n in range(2, most + 1):
        if float(student_t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n) <= half_width:
            return n
    return None


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student's t interval of the mean of ``values``."""
    from scipy.stats import t as student_t

    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        raise ValueError("t_interval needs at least one value")
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, math.nan)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(student_t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, sd)


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What the study's tables use from one run's results folder."""

    steps: int
    tokens: int
    parameters: int
    final_val: float
    late_val: float
    final_train: float
    validation: tuple[tuple[int, int, float], ...]
    """(step, tokens, val_loss) of every validation point, in step order."""
    decay_start: int
    """The step where the learning rate starts to decay (the end of the WSD stable phase; `steps` if none)."""


def summarize_run(directory: Path) -> RunSummary:
    """The summary of a completed run; errors name the folder and what is missing."""
    from models.config import ModelConfig
    from models.flops import count_parameters

    directory = Path(directory)
    records = keep_last_per_step(read_jsonl(directory / "metrics.jsonl"))
    config = yaml.safe_load((directory / "config.yaml").read_text())
    steps = int(config["train"]["steps"])
    if not records or records[-1]["step"] != steps:
        raise ValueError(f"{directory}: metrics.jsonl does not reach step {steps}: not a completed run")
    validation = tuple((int(r["step"]), int(r["tokens"]), float(r["val_loss"]))
                       for r in records if finite(r.get("val_loss")))
    if not validation or validation[-1][0] != steps:
        raise ValueError(f"{directory}: no validation loss at the last step {steps}")
    late = [loss for step, _, loss in validation if after_fraction(step, steps, LATE_FRACTION)]
    tail = [r["loss"] for r in records if after_fraction(r["step"], steps, TRAIN_TAIL_FRACTION)
            and finite(r.get("loss"))]
    optim = config.get("optim", {})
    decay_fraction = float(optim.get("decay_fraction", 0.0))
    # as trainer/optim.py counts the WSD decay: round(decay_fraction * steps) steps, at least one
    decay_start = (steps - max(1, round(decay_fraction * steps))
                   if optim.get("schedule") == "wsd" and decay_fraction > 0 else steps)
    return RunSummary(steps=steps, tokens=int(records[-1]["tokens"]), decay_start=decay_start,
                      parameters=count_parameters(ModelConfig(**config["model"])),
                      final_val=validation[-1][2], late_val=sum(late) / len(late),
                      final_train=sum(tail) / len(tail), validation=validation)


MEASURES = {"final": "final_val", "late": "late_val", "train": "final_train"}
"""Short names of the summarized losses."""


def paired_gaps(arm: dict[int, RunSummary], reference: dict[int, RunSummary], measure: str) -> dict[int, float]:
    """{seed: 100 * (arm / reference - 1)} over the seeds both have; measure: a MEASURES key."""
    field = MEASURES[measure]
    return {seed: 100 * (getattr(arm[seed], field) / getattr(reference[seed], field) - 1)
            for seed in sorted(set(arm) & set(reference))}


def gap_interval(arm: dict[int, RunSummary], reference: dict[int, RunSummary], measure: str) -> Optional[Interval]:
    gaps = paired_gaps(arm, reference, measure)
    return t_interval(list(gaps.values())) if gaps else None


def difference_interval(first: dict[int, RunSummary], second: dict[int, RunSummary],
                        reference: dict[int, RunSummary], measure: str) -> Optional[Interval]:
    """Gap of ``first`` minus gap of ``second``, in percentage points, paired over the seeds all three have."""
    a, b = paired_gaps(first, reference, measure), paired_gaps(second, reference, measure)
    seeds = sorted(set(a) & set(b))
    return t_interval([a[s] - b[s] for s in seeds]) if seeds else None


STABLE_FROM_FRACTION = Fraction(1, 5)
"""The stable phase's validation points start after this fraction of the steps."""


def decay_growth_interval(arm: dict[int, RunSummary], reference: dict[int, RunSummary]) -> Optional[Interval]:
    """Mean gap (%) over the decay phase minus over the stable phase, paired by seed (see the module docstring)."""
    values = []
    for seed in sorted(set(arm) & set(reference)):
        run, ref = arm[seed], reference[seed]
        if run.decay_start >= run.steps:
            return None  # no decay phase
        ref_loss = {step: loss for step, _, loss in ref.validation}
        gaps = [(step, 100 * (loss / ref_loss[step] - 1)) for step, _, loss in run.validation if step in ref_loss]
        stable = [g for step, g in gaps if after_fraction(step, run.steps, STABLE_FROM_FRACTION)
                  and step <= run.decay_start]
        decay = [g for step, g in gaps if step > run.decay_start]
        if not stable or not decay:
            return None
        values.append(sum(decay) / len(decay) - sum(stable) / len(stable))
    return t_interval(values) if values else None


def gap_curve(arm: dict[int, RunSummary], reference: dict[int, RunSummary]) -> list[tuple[int, Interval]]:
    """(tokens, interval of the paired validation gap in %) at every validation point all seeds share."""
    seeds = sorted(set(arm) & set(reference))
    if not seeds:
        return []
    by_seed = [({step: (tokens, loss) for step, tokens, loss in arm[s].validation},
                {step: loss for step, _, loss in reference[s].validation}) for s in seeds]
    steps = sorted(set.intersection(*(set(a) & set(r) for a, r in by_seed)))
    return [(by_seed[0][0][step][0], t_interval([100 * (a[step][1] / r[step] - 1) for a, r in by_seed]))
            for step in steps]


def loss_curve(arm: dict[int, RunSummary]) -> list[tuple[int, Interval]]:
    """(tokens, interval of the validation loss over seeds) at every validation point all seeds share."""
    seeds = sorted(arm)
    if not seeds:
        return []
    points = [{step: (tokens, loss) for step, tokens, loss in arm[s].validation} for s in seeds]
    steps = sorted(set.intersection(*(set(p) for p in points)))
    return [(points[0][step][0], t_interval([p[step][1] for p in points])) for step in steps]


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)
