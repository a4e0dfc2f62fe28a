"""parallel=auto: the fastest layout that fits the launched world, chosen by the planner.

    choice = choose_layout(cfg, gpu, gpus, gpus_per_node)    # cfg.parallel.auto true or not
    choice.config, choice.plan, choice.line(), choice.overrides(), choice.comparison()
    explicit_vs_auto(cfg, gpu, gpus)                          # how much slower an explicit layout is

What it searches (everything else, parallel.compile, param_dtype, fsdp, the precision and the model, stays
as configured):

    parallel.tp, parallel.cp       pairs whose product divides the GPUs per node and the world and that pass
                                   trainer.validate.tensor_parallel_problem and context_parallel_problem
    dp_shard x dp_replicate        every factorisation of the data-parallel ranks (world / (tp x cp)): flat
                                   FSDP, HSDP with shard groups inside a node, and every shard size between
    train.micro_batch_size         every size whose batch train.batch_policy accepts (trainer.planning.batch:
                                   each layout runs its own resolved batch)
    activation_checkpoint          'none', 'full' and every proper subset of the pattern's symbols
    reshard, grad_reduce           per_micro_batch / per_step each
    reduce_dtype                   float32, bfloat16

Objective: the step's seconds per token trained (each layout at its own resolved batch). Among layouts
within TIE_TOLERANCE of the fastest, preferred in order: the configured batch run exactly, float32 gradient
reduction, the smaller tensor-parallel degree, the smaller context-parallel degree, then the faster. So an adjusted batch or BF16 reduction is
chosen only when it is more than 0.2% faster.

Speed (it runs at every trainer start): every (tp, cp, micro-batch, checkpointing) combination is planned once
in its leanest memory (the largest shard group, gathers and reductions per micro-batch, BF16 reduction);
one that cannot fit there is dropped, and a micro-batch that does not fit with full checkpointing ends the
micro-batch sizes of that (tp, cp). The rest are ordered by a lower bound of their seconds per token (compute,
TP and CP communication of that lean plan, its FSDP weight copies taken at the fewest any policy makes: the
other meshes and policies only add exposed FSDP/HSDP traffic or memory) and planned in full, mesh by mesh and policy by policy, until the bound passes the best found.
The plans share their per-micro-batch work and the precision plan (built once on the meta device).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from models.config import ModelConfig
from trainer.config import TrainConfig
from trainer.hardware import GpuSpec
from trainer.planning.batch import ResolvedBatch, accepted_batch, resolve_global_batch
from trainer.planning.layout import DTYPE_BYTES, resolve_layout
from trainer.planning.memory import GIB, plan_memory
from trainer.planning.plan import RunPlan, describe_layout, format_seconds, plan_run, usable_memory_gib
from trainer.planning.step_time import H200_CALIBRATED, weight_copy_bytes
from trainer.validate import ConfigError, context_parallel_problem, tensor_parallel_problem

TIE_TOLERANCE = 0.002
"""Layouts within this share of the fastest's seconds per token count as ties (the preferences decide)."""
POLICIES = tuple(itertools.product(("per_micro_batch", "per_step"), ("per_step", "per_micro_batch"),
                                   ("float32", "bfloat16")))
"""(reshard, grad_reduce, reduce_dtype) searched."""
LEAN_POLICIES = (("per_micro_batch", "per_micro_batch", "bfloat16"), ("per_micro_batch", "per_step", "bfloat16"))
"""The least memory a layout can take (the unsharded gradient of grad_reduce=per_step is smaller only at shard 1)."""
RUNNERS_UP = 5


@dataclass
class AutoChoice:
    """parallel=auto's answer for one world: the chosen config and plan, and what it was chosen over."""

    config: TrainConfig
    """cfg with the searched fields replaced (parallel.auto as given)."""
    plan: RunPlan
    """The chosen plan; when nothing fits, the plan needing the least memory (plan.fits is then false)."""
    runners_up: List[RunPlan] = field(default_factory=list)
    """The next fastest fitting layouts, fastest first (distinct layouts, at most RUNNERS_UP)."""
    best_per_tp: Dict[Tuple[int, int], Optional[RunPlan]] = field(default_factory=dict)
    """The fastest fitting plan of each (tp, cp) searched (None: none fits)."""
    refused_tp: Dict[Tuple[int, int], str] = field(default_factory=dict)
    """(tp, cp) pairs not searched, and why (the batch policy, the model's dimensions, the sequence)."""
    bound_per_tp: Dict[Tuple[int, int], float] = field(default_factory=dict)
    """The lowest bound of each (tp, cp)'s seconds per token (a pair whose bound passed the best is not
    planned in full)."""
    considered: int = 0
    """Layouts planned in full."""

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def line(self) -> str:
        """One line: the layout, its step time and MFU (what the trainer prints at start)."""
        plan, layout = self.plan, self.plan.layout
        batch = layout.batch
        adjusted = (f" (train.global_batch_size {batch.configured} {100 * batch.deviation:+.1f}%)"
                    if batch.adjusted else "")
        verdict = "" if plan.fits else f"; does NOT fit: {plan.peak_memory_gib:.1f} of {plan.usable_memory_gib:.1f} GiB"
        return (f"parallel=auto on {layout.gpus} x {layout.gpu.name}: {describe_layout(layout)}, batch "
                f"{layout.global_batch}{adjusted}: {format_seconds(plan.step_time_s)} a step, MFU "
                f"{100 * plan.mfu:.1f}%, {plan.peak_memory_gib:.1f} GiB per GPU{verdict}")

    def overrides(self) -> List[str]:
        """The overrides that run this layout explicitly (parallel.auto=false)."""
        return layout_overrides(self.config)

    def comparison(self) -> str:
        """The chosen layout against the runners-up and the best of each (tp, cp)."""
        best = self.plan.seconds_per_token
        rows = [f"  chosen      {describe_layout(self.plan.layout)}: {format_seconds(self.plan.step_time_s)}, "
                f"MFU {100 * self.plan.mfu:.1f}%"]
        for plan in self.runners_up:
            rows.append(f"  {100 * (plan.seconds_per_token / best - 1):+6.1f}%     {describe_layout(plan.layout)}: "
                        f"MFU {100 * plan.mfu:.1f}%")
        for degree, plan in sorted(self.best_per_tp.items()):
            name = degree_name(degree)
            if plan is None and degree in self.bound_per_tp:
                rows.append(f"  {name}: at least {100 * (self.bound_per_tp[degree] / best - 1):+.1f}% (its compute "
                            f"and TP/CP communication alone; not planned in full)")
            elif plan is None:
                rows.append(f"  {name}: no layout fits")
            elif plan is not self.plan:
                rows.append(f"  {name} at best {100 * (plan.seconds_per_token / best - 1):+.1f}%: "
                            f"{describe_layout(plan.layout)}")
        rows += [f"  {degree_name(degree)}: {why}" for degree, why in sorted(self.refused_tp.items())]
        return "\n".join(rows)


def layout_overrides(cfg: TrainConfig) -> List[str]:
    """The searched fields of ``cfg`` as command-line overrides, with parallel.auto=false."""
    parallel = cfg.parallel
    return ["parallel.auto=false", f"parallel.tp={parallel.tp}", f"parallel.cp={parallel.cp}",
            f"parallel.dp_shard={parallel.dp_shard}",
            f"parallel.dp_replicate={parallel.dp_replicate}", f"train.micro_batch_size={cfg.train.micro_batch_size}",
            f"parallel.activation_checkpoint={parallel.activation_checkpoint}", f"parallel.reshard={parallel.reshard}",
            f"parallel.grad_reduce={parallel.grad_reduce}", f"parallel.reduce_dtype={parallel.reduce_dtype}"]


# ---------------------------------------------------------------------------- the search space
def degree_name(degree: Tuple[int, int]) -> str:
    """'tp 2', 'tp 2 x cp 4'."""
    tp, cp = degree
    return f"tp {tp}" if cp == 1 else f"tp {tp} x cp {cp}"


def tp_degrees(cfg: TrainConfig, model: ModelConfig, gpus: int,
               gpus_per_node: int) -> Tuple[List[Tuple[int, int]], Dict[Tuple[int, int], str]]:
    """((tp, cp) pairs to search, {pair: why not} for those the model or the sequence cannot be split into):
    tp x cp divides the GPUs of a node and the world (both inside one NVLink domain)."""
    degrees, refused = [], {}
    for tp in range(1, gpus_per_node + 1):
        for cp in range(1, gpus_per_node // tp + 1):
            if gpus_per_node % (tp * cp) or gpus % (tp * cp):
                continue
            problem = ((tensor_parallel_problem(model, tp, cfg.data.seq_len) if tp > 1 else "")
                       or (context_parallel_problem(cp, tp, cfg.data.seq_len, model) if cp > 1 else ""))
            if problem:
                refused[(tp, cp)] = problem
            else:
                degrees.append((tp, cp))
    return degrees, refused


def mesh_options(dp_ranks: int) -> List[Tuple[int, int]]:
    """(dp_shard, dp_replicate) for every shard size dividing the data-parallel ranks, largest shard first."""
    return [(shard, dp_ranks // shard) for shard in range(dp_ranks, 0, -1) if dp_ranks % shard == 0]


def micro_batches(cfg: TrainConfig, dp_ranks: int, tp: int, cp: int = 1) -> List[ResolvedBatch]:
    """The micro-batch sizes whose batch train.batch_policy accepts on dp_ranks ranks, smallest first."""
    train = cfg.train
    largest = math.floor(train.global_batch_size * (1 + train.batch_tolerance) / dp_ranks)
    return [resolve_global_batch(train.global_batch_size, micro, dp_ranks, train.batch_policy,
                                 train.batch_tolerance, tp, cp)
            for micro in range(1, largest + 1)
            if accepted_batch(train.global_batch_size, micro, dp_ranks, train.batch_policy, train.batch_tolerance)]


def checkpoint_options(pattern: str) -> List[str]:
    """'none', each proper subset of the pattern's symbols (in 'M*-' order), 'full'."""
    symbols = [s for s in "M*-" if s in pattern]
    subsets = ["".join(c) for size in range(1, len(symbols)) for c in itertools.combinations(symbols, size)]
    return ["none", *subsets, "full"]


def with_layout(cfg: TrainConfig, degree: Tuple[int, int], shard: int, replicate: int, micro: int, checkpoint: str,
                reshard: str, grad_reduce: str, reduce_dtype: str) -> TrainConfig:
    """cfg with the searched fields replaced (``degree``: (tp, cp))."""
    tp, cp = degree
    parallel = dataclasses.replace(cfg.parallel, tp=tp, cp=cp, dp_shard=shard, dp_replicate=replicate,
                                   activation_checkpoint=checkpoint, reshard=reshard, grad_reduce=grad_reduce,
                                   reduce_dtype=reduce_dtype)
    return dataclasses.replace(cfg, parallel=parallel, train=dataclasses.replace(cfg.train, micro_batch_size=micro))


# ---------------------------------------------------------------------------- the search
@dataclass
class _Combo:
    """One ((tp, cp), micro-batch, checkpointing) with its lean plan and the bound of its seconds per token."""

    degree: Tuple[int, int]
    micro: int
    checkpoint: str
    bound: float
    meshes: List[Tuple[int, int]]


def _lower_bound(plan: RunPlan, model: ModelConfig) -> float:
    """Seconds per token no mesh or policy of this (tp, cp, micro, checkpointing) beats: the lean plan's compute
    (its optimizer over the largest shard group), TP communication (replicated gradients at that shard) and CP
    communication, its FSDP weight copies replaced by the fewest any policy makes (gathering and reducing once
    a step copies less than the lean per-micro-batch policies: step_time.weight_copy_bytes)."""
    layout, parts = plan.layout, plan.time.parts
    copies = 0.0
    if layout.fsdp:
        lean = weight_copy_bytes(model, layout)
        fewest = min(weight_copy_bytes(model, dataclasses.replace(layout, reshard=reshard, grad_reduce=reduce,
                                                                  reduce_bytes=DTYPE_BYTES[dtype]))
                     for reshard, reduce, dtype in POLICIES)
        # per step (the accumulation's micro-batches), with the idle share plan_step_time adds to every kernel
        copies = (layout.accumulation * (lean - fewest) * (1 + H200_CALIBRATED.idle)
                  / (layout.gpu.hbm_bytes_per_s * H200_CALIBRATED.memory))
    return (plan.time.compute - copies + parts.get("tensor-parallel communication", 0.0)
            + parts.get("context-parallel communication", 0.0)) / plan.tokens_per_step


def _preference(plan: RunPlan) -> tuple:
    layout = plan.layout
    return (layout.batch.adjusted, layout.reduce_dtype != "float32", layout.tp, layout.cp, plan.seconds_per_token)


class _Search:
    def __init__(self, cfg: TrainConfig, gpu: GpuSpec, gpus: int, gpus_per_node: int,
                 token_budget: Optional[float], model: ModelConfig):
        self.cfg, self.gpu, self.gpus, self.node = cfg, gpu, gpus, gpus_per_node
        self.budget, self.model = token_budget, model
        self.fitting: List[RunPlan] = []
        self.leanest: Optional[Tuple[float, TrainConfig]] = None
        """(peak bytes, config) of the layout needing the least memory seen."""
        self.first_error: Optional[ConfigError] = None
        """The first refusal of a layout the batch policy accepts (parallel.fsdp=off on many ranks, ...)."""
        self.considered = 0

    def plan(self, degree, shard, replicate, micro, checkpoint, policy) -> Optional[RunPlan]:
        candidate = with_layout(self.cfg, degree, shard, replicate, micro, checkpoint, *policy)
        try:
            return plan_run(candidate, self.gpu, self.gpus, self.node, self.budget, self.model)
        except ConfigError:
            return None

    def lean_plan(self, degree, dp, micro, checkpoint) -> Optional[RunPlan]:
        """The least-memory plan of this ((tp, cp), micro-batch, checkpointing), planned in full only if it fits."""
        lean = None
        for policy in LEAN_POLICIES[: 2 if dp * degree[1] == 1 else 1]:
            candidate = with_layout(self.cfg, degree, dp, 1, micro, checkpoint, *policy)
            try:
                layout = resolve_layout(candidate, self.gpu, self.gpus, self.node, model=self.model)
            except ConfigError as error:
                self.first_error = self.first_error or error
                continue
            peak = plan_memory(self.model, layout).peak
            if lean is None or peak < lean[0]:
                lean = (peak, candidate)
        if lean is None:
            return None
        if self.leanest is None or lean[0] < self.leanest[0]:
            self.leanest = lean
        if lean[0] / GIB > usable_memory_gib(self.gpu):
            return None
        return plan_run(lean[1], self.gpu, self.gpus, self.node, self.budget, self.model)

    def combos(self, degree: Tuple[int, int], checkpoints: List[str]) -> List[_Combo]:
        tp, cp = degree
        dp = self.gpus // (tp * cp)
        mode = {"True": "on", "False": "off", "true": "on", "false": "off"}.get(str(self.cfg.parallel.fsdp),
                                                                               self.cfg.parallel.fsdp)
        meshes = mesh_options(dp) if mode == "on" or (mode == "auto" and self.gpus > 1) else [(1, 1)]
        out = []
        for batch in micro_batches(self.cfg, dp, tp, cp):
            fitted = False
            for checkpoint in checkpoints:
                lean = self.lean_plan(degree, dp, batch.micro_batch, checkpoint)
                if lean is not None:
                    fitted = True
                    out.append(_Combo(degree, batch.micro_batch, checkpoint, _lower_bound(lean, self.model), meshes))
            if not fitted:
                break  # larger micro-batches only need more memory
        return out

    def evaluate(self, combo: _Combo) -> None:
        for (shard, replicate), policy in itertools.product(combo.meshes, POLICIES):
            plan = self.plan(combo.degree, shard, replicate, combo.micro, combo.checkpoint, policy)
            self.considered += 1
            if plan is not None and plan.fits:
                self.fitting.append(plan)

    def best_seconds_per_token(self) -> float:
        return min((p.seconds_per_token for p in self.fitting), default=math.inf)

    def run(self, degrees: List[Tuple[int, int]]) -> List[_Combo]:
        checkpoints = checkpoint_options(self.model.pattern)
        combos = sorted((c for degree in degrees for c in self.combos(degree, checkpoints)), key=lambda c: c.bound)
        for combo in combos:
            if combo.bound > self.best_seconds_per_token() * (1 + TIE_TOLERANCE):
                break
            self.evaluate(combo)
        return combos


def _distinct(plans: List[RunPlan]) -> List[RunPlan]:
    seen, out = set(), []
    for plan in plans:
        key = tuple(layout_overrides(plan.config))
        if key not in seen:
            seen.add(key)
            out.append(plan)
    return out


def _batch_refusal(cfg: TrainConfig, gpus: int, degrees: List[Tuple[int, int]]) -> str:
    """Why no (tp, cp) runs the batch: the tp=1 (or smallest) refusal, naming the degrees tried."""
    tp, cp = degrees[0] if degrees else (1, 1)
    train = cfg.train
    try:
        resolve_global_batch(train.global_batch_size, train.micro_batch_size, gpus // (tp * cp), train.batch_policy,
                             train.batch_tolerance, tp, cp)
    except ConfigError as error:
        tried = sorted({degree[0] for degree in degrees})
        return f"parallel=auto: no micro-batch at parallel.tp in {tried} (with any parallel.cp) runs it either; {error}"
    return f"parallel=auto: no layout on {gpus} GPUs runs train.global_batch_size ({train.global_batch_size})"


def choose_layout(cfg: TrainConfig, gpu: GpuSpec, gpus: int, gpus_per_node: Optional[int] = None,
                  token_budget: Optional[float] = None, model: Optional[ModelConfig] = None) -> AutoChoice:
    """The fastest layout of ``cfg`` that fits ``gpus`` devices like ``gpu`` (the module docstring).

    ConfigError when no layout runs the batch train.batch_policy accepts (its message lists the GPU counts
    that do); an AutoChoice whose plan does not fit when nothing fits.
    """
    model = model or cfg.model
    node = gpus_per_node or min(gpus, gpu.nvlink_domain if gpu.name != "CPU" else gpus)
    degrees, refused = tp_degrees(cfg, model, gpus, node)
    search = _Search(cfg, gpu, gpus, node, token_budget, model)
    combos = search.run(degrees)
    for tp, cp in degrees:
        if not micro_batches(cfg, gpus // (tp * cp), tp, cp):
            refused[(tp, cp)] = (f"no micro-batch gives a batch train.batch_policy={cfg.train.batch_policy} accepts "
                                 f"on {gpus // (tp * cp)} data-parallel ranks")
    if search.leanest is None:
        if search.first_error is not None:  # the batch runs, the layout fields do not
            raise search.first_error
        raise ConfigError(_batch_refusal(cfg, gpus, degrees))
    ranked = sorted(search.fitting, key=lambda p: p.seconds_per_token)
    if not ranked:
        chosen = plan_run(search.leanest[1], gpu, gpus, node, token_budget, model)
        return AutoChoice(_keep_auto(cfg, chosen.config), chosen, refused_tp=refused, considered=search.considered)

    best = ranked[0].seconds_per_token
    ties = [p for p in ranked if p.seconds_per_token <= best * (1 + TIE_TOLERANCE)]
    chosen = min(ties, key=_preference)
    mine = layout_overrides(chosen.config)
    others = [p for p in _distinct(ranked) if layout_overrides(p.config) != mine]
    best_per_tp = {degree: next((p for p in ranked if (p.layout.tp, p.layout.cp) == degree), None)
                   for degree in degrees if degree not in refused}
    best_per_tp[(chosen.layout.tp, chosen.layout.cp)] = chosen
    bounds = {}
    for combo in combos:
        bounds[combo.degree] = min(bounds.get(combo.degree, math.inf), combo.bound)
    return AutoChoice(_keep_auto(cfg, chosen.config), chosen, others[:RUNNERS_UP], best_per_tp, refused, bounds,
                      search.considered)


def _keep_auto(original: TrainConfig, chosen: TrainConfig) -> TrainConfig:
    return dataclasses.replace(chosen, parallel=dataclasses.replace(chosen.parallel, auto=original.parallel.auto))


def explicit_vs_auto(cfg: TrainConfig, gpu: GpuSpec, gpus: int, gpus_per_node: Optional[int] = None,
                     token_budget: Optional[float] = None, model: Optional[ModelConfig] = None,
                     plan: Optional[RunPlan] = None) -> Tuple[Optional[AutoChoice], Optional[float]]:
    """(parallel=auto's choice for the same run, how much slower ``cfg``'s explicit layout is per token:
    0.25 = 25% slower; None when either does not fit or auto has nothing that runs)."""
    plan = plan or plan_run(cfg, gpu, gpus, gpus_per_node, token_budget, model)
    try:
        choice = choose_layout(cfg, gpu, gpus, gpus_per_node, token_budget, model)
    except ConfigError:
        return None, None
    if not (plan.fits and choice.fits):
        return choice, None
    return choice, plan.seconds_per_token / choice.plan.seconds_per_token - 1
