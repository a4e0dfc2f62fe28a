"""study.stats and study.definition: intervals against scipy, pairing by seed, the phases,
and the study file's expansion and errors."""

from __future__ import annotations

import math
import textwrap

import pytest
from scipy import stats

from study.definition import load_study
from study.stats import (
    LATE_FRACTION,
    RunSummary,
    after_fraction,
    decay_growth_interval,
    difference_interval,
    gap_curve,
    gap_interval,
    seeds_for_half_width,
    summarize_run,
    t_interval,
)


def test_t_interval_matches_scipy_on_random_samples():
    import random

    generator = random.Random(7)
    for n in (2, 3, 5, 12):
        values = [generator.gauss(1.0, 0.5) for _ in range(n)]
        interval = t_interval(values)
        low, high = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
        assert (interval.low, interval.high) == pytest.approx((low, high), rel=1e-12)
        assert interval.sd == pytest.approx(stats.tstd(values), rel=1e-12)
    single = t_interval([0.3])
    assert single.n == 1 and math.isnan(single.low) and not single.resolved and single.verdict() == "one seed"


def summary(losses: dict[int, float], steps: int = 100, decay_start: int = 80) -> RunSummary:
    validation = tuple((step, step * 10, loss) for step, loss in sorted(losses.items()))
    final = validation[-1][2]
    late = [loss for step, _, loss in validation if 10 * step > 7 * steps]
    return RunSummary(steps=steps, tokens=steps * 10, parameters=1, final_val=final, late_val=sum(late) / len(late),
                      final_train=final, validation=validation, decay_start=decay_start)


def test_gaps_are_paired_by_seed_and_ignore_unpaired_seeds():
    reference = {0: summary({50: 2.0, 100: 1.0}), 1: summary({50: 2.0, 100: 2.0})}
    arm = {0: summary({50: 2.2, 100: 1.1}), 1: summary({50: 2.0, 100: 2.1}), 7: summary({50: 9.0, 100: 9.0})}
    final = gap_interval(arm, reference, "final")
    assert final.n == 2 and final.mean == pytest.approx((10.0 + 5.0) / 2)
    other = {0: summary({50: 2.0, 100: 1.05}), 1: summary({50: 2.0, 100: 2.0})}
    difference = difference_interval(arm, other, reference, "final")
    assert difference.mean == pytest.approx(((10 - 5) + (5 - 0)) / 2)
    assert [tokens for tokens, _ in gap_curve(arm, reference)] == [500, 1000]


def test_decay_growth_compares_the_decay_points_with_the_stable_ones():
    points = {30: 1.0, 60: 1.0, 90: 1.0, 100: 1.0}
    reference = {s: summary(points) for s in (0, 1, 2)}
    # gap 1% in the stable phase (steps 30, 60), 3% in the decay (90, 100) for every seed, +-0.1
    arm = {s: summary({30: 1.01, 60: 1.01, 90: 1.03 + 0.001 * s, 100: 1.03 + 0.001 * s}) for s in (0, 1, 2)}
    growth = decay_growth_interval(arm, reference)
    assert growth.mean == pytest.approx(2.1) and growth.verdict(above="grows", below="shrinks") == "grows"
    no_decay = {s: summary(points, decay_start=100) for s in (0, 1)}
    assert decay_growth_interval(no_decay, no_decay) is None


def write(tmp_path, text: str):
    path = tmp_path / "study.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_study_file_expands_into_size_arm_seed_runs(tmp_path):
    study = load_study(write(tmp_path, """
        name: demo
        reference: a
        seeds: [0, 1]
        seed_overrides: ["seed={seed}", "precision.seed={seed}"]
        sizes:
          small: {overrides: [model=tiny], arms: all}
          big: {overrides: [model.hidden_size=128], arms: [a], seeds: [0, 1, 2]}
        arms:
          a: {experiment: quickstart, overrides: [precision=bf16]}
          b: {experiment: quickstart, overrides: []}
        comparisons: [[b, a]]
    """))
    ids = [run.id for run in study.runs()]
    assert ids == ["small/a/seed0", "small/a/seed1", "small/b/seed0", "small/b/seed1",
                   "big/a/seed0", "big/a/seed1", "big/a/seed2"]
    (run,) = study.select(["big/a/seed2"])
    assert run.trainer_arguments() == ["+experiment=quickstart", "model.hidden_size=128", "precision=bf16",
                                       "seed=2", "precision.seed=2"]
    assert [r.id for r in study.select(["small/*/seed1"])] == ["small/a/seed1", "small/b/seed1"]
    # the patterns' order, then the file's: a long run named first starts first
    assert [r.id for r in study.select(["big/a/seed2", "small/*/seed0", "*/a/*"])] == [
        "big/a/seed2", "small/a/seed0", "small/b/seed0", "small/a/seed1", "big/a/seed0", "big/a/seed1"]
    assert study.results == tmp_path
    with pytest.raises(ValueError, match="no run of study 'demo' matches 'huge/\\*'"):
        study.select(["huge/*"])


@pytest.mark.parametrize("text, message", [
    ("name: x\nreference: z\nseeds: [0]\nsizes: {s: {}}\narms: {a: {experiment: e}}\n", "reference 'z' is not an arm"),
    ("name: x\nreference: a\nseeds: [0, 0]\nsizes: {s: {}}\narms: {a: {experiment: e}}\n", "seeds must be distinct"),
    ("name: x\nreference: a\nseeds: [0]\nsizes: {s: {arms: [q]}}\narms: {a: {experiment: e}}\n", "unknown arm"),
    ("name: x\nreference: a\nseeds: [0]\nsizes: {s: {}}\narms: {a: {overrides: []}}\n", "needs an experiment"),
    ("name: x\nreference: a\nseeds: [0]\nsizes: {s: {}}\narms: {a: {experiment: e}}\ncomparisons: [[a, q]]\n",
     "must name two arms"),
    ("name: x\nreference: a\nseeds: [0]\nsizes: {s: {}}\narms: {a: {experiment: e}}\nseed_overrides: [seed=1]\n",
     "must contain"),
    ("name: x\nreference: a\nseeds: [0]\narms: {a: {experiment: e}}\n", "missing sizes"),
    ("name: x\nreference: a\nseeds: [0]\nsizes: {s: {}}\narms: {a: {experiment: e}}\ntypo: 1\n", "unknown key"),
])
def test_a_malformed_study_file_is_refused_naming_the_field(tmp_path, text, message):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_study(path)


def test_the_last_30_percent_window_is_counted_in_integers():
    """The window holds the points at steps s with 10 s > 7 steps. In floating point 0.7 * 1400 is
    979.9999999999999, so `step > 0.7 * steps` would put step 980 in it; the bound here is computed
    independently of the float product, as the integer part of 7 * steps / 10."""
    assert 0.7 * 1400 < 980 and 0.7 * 2880 < 2016  # the trap
    for steps, every, first in ((1400, 70, 1050), (2880, 144, 2160), (460, 23, 345), (4840, 242, 3630)):
        points = list(range(every, steps + 1, every))
        bound = steps * 7 // 10  # the last step of the first 70%
        window = [step for step in points if after_fraction(step, steps, LATE_FRACTION)]
        assert window == [step for step in points if step > bound]
        assert window[0] == first and window[-1] == steps and len(window) == 6, steps
    assert not after_fraction(980, 1400, LATE_FRACTION) and after_fraction(981, 1400, LATE_FRACTION)


def test_a_run_s_late_loss_averages_the_window_s_six_points(tmp_path):
    """summarize_run on a 1400-step run evaluated every 70 steps: the late loss is the mean of the losses
    at steps 1050-1400 (six points), not of 980-1400 (seven)."""
    import json
    from pathlib import Path

    committed = Path(__file__).resolve().parents[2] / "results" / "study" / "9m" / "bf16" / "seed0" / "config.yaml"
    (tmp_path / "config.yaml").write_text(committed.read_text())
    lines = [{"step": step, "tokens": step * 65536, "loss": 2.0} for step in range(10, 1401, 10)]
    for line in lines:
        if line["step"] % 70 == 0:
            line["val_loss"] = float(line["step"])  # the loss names its step
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = summarize_run(tmp_path)
    assert run.steps == 1400 and run.decay_start == 1120
    assert run.late_val == pytest.approx(sum(range(1050, 1401, 70)) / 6)


def test_seeds_for_a_half_width_follow_the_t_quantile():
    for sd, width in ((0.1, 0.2), (0.3, 0.2), (0.34, 0.2), (1.0, 0.1)):
        n = seeds_for_half_width(sd, width)
        assert stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) <= width
        assert n == 2 or stats.t.ppf(0.975, n - 2) * sd / math.sqrt(n - 1) > width
    assert seeds_for_half_width(0.0, 0.2) == 2 and seeds_for_half_width(50.0, 0.01, most=100) is None
