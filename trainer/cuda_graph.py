"""parallel.cuda_graph: each micro-batch's forward + backward recorded once into a CUDA graph and replayed.

Why: a small model (the study model at micro-batch 32 x 1024 tokens) is host-bound. Its step
launches ~800 kernels in BF16 and ~1,400 in emulated NVFP4, and Python, the dispatcher and the
launches take longer than the GPU does (docs/performance.md: the GPU idles 61 of 80 ms in BF16).
Replaying a graph launches the recorded kernels with no host work per kernel: on the H200 the
study model's full training step takes 20.7 instead of 72.9 ms in BF16 and 35.1 instead of
98.0 ms in NVFP4.

What a replay does and does not do. A replay re-runs the recorded kernels on the same memory,
reading whatever those tensors hold now; no Python runs. So:
- the micro-batch is copied into static input buffers first (``inputs``, ``labels``: [B, T]);
- the parameters are updated in place by the optimizer (their addresses never change);
- the gradients are persistent buffers: recorded with ``.grad`` already present, backward's
  AccumulateGrad adds in place (``grad += new``), which is gradient accumulation as eager
  runs it. Before micro-batch 0 of each step they are put back on the parameters (the loop's
  ``zero_grad(set_to_none=True)`` dropped them) and zeroed;
- the stochastic-rounding seeds are device tensors (``QuantizedLinear.sr_seed``) written in place
  before each micro-batch: a replay draws the new step's random bits;
- the loss comes back in a static tensor, overwritten by the next replay (the caller adds it
  to its running sum first, in stream order).

Where the graph cannot hold, the micro-step runs eagerly (the same compiled blocks, no replay):
- the warm-up micro-steps before the capture (compilation, autotuning, lazy initialization and
  the caching allocator's growth must not happen while capturing);
- steps with quantization diagnostics due (their forward hooks are Python: a replay skips them);
- a change of ``variant`` (the late switch to BF16 changes which GEMMs quantize): the graph is
  dropped and recaptured after a new warm-up.

Refused (``check_cuda_graph_supported``, and trainer/validate.py for what the config alone
decides): several processes or FSDP (collectives and resharding are outside what one recorded
graph reproduces), a device other than CUDA, Transformer Engine's backend (its FP8 state is
updated on the host), and activation checkpointing (its recomputation under a graph is untested). A capture that fails (something in the
step synchronizes with the host, e.g. the torch fallback of stochastic rounding reading a seed)
raises an error naming the option.

Memory: the graph keeps its activations and temporaries in a private pool for the whole run;
an eager micro-step (diagnostics) and evaluation allocate theirs on top of it.

Source: PyTorch's CUDA graphs notes ("whole-network capture", "usage with multiple streams"),
``torch.cuda.graph`` and ``torch.cuda.CUDAGraph``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

CaptureFn = Callable[[Callable[[], torch.Tensor]], Callable[[], None]]


def check_cuda_graph_supported(env, applied: dict, backend: str) -> None:
    """Raise naming parallel.cuda_graph when this run cannot be replayed from one graph."""
    problems = []
    if env.device.type != "cuda":
        problems.append(f"it needs a CUDA device (this run is on {env.device.type})")
    if env.world_size > 1 or applied.get("fsdp"):
        problems.append(f"it runs one process without FSDP (world size {env.world_size}, "
                        f"FSDP {'on' if applied.get('fsdp') else 'off'}): collectives are not recorded")
    if backend == "te":
        problems.append("Transformer Engine's backend keeps FP8 state on the host; use precision.backend=torch "
                        "or emulated")
    if problems:
        raise ValueError("parallel.cuda_graph=true cannot be used here: " + "; ".join(problems))


def capture_cuda_graph(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """Record ``fn`` into a CUDA graph; returns the graph's ``replay``. Nothing executes while recording.

    The caller has warmed ``fn`` up (compilation, autotuning, lazy initialization and allocator
    growth must not happen while capturing). torch.cuda.graph records on a stream of its own after
    a device synchronize, so what ran before (the input copy, the gradient zeroing) is done first.
    """
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class GraphedMicroStep:
    """The training micro-step, replayed from a CUDA graph after ``warmup`` eager micro-steps.

    ``micro_step(batch, index)`` runs ``forward_backward(batch)`` (a loss tensor, detached) on a
    batch {"inputs", "labels"} of [B, T] token ids. ``capture`` records a callable into a graph
    and returns its replay (tests on the CPU pass a stand-in whose replay calls the function).
    """

    def __init__(self, model: torch.nn.Module, forward_backward: Callable[[dict], torch.Tensor],
                 device: torch.device, warmup: int = 3, capture: CaptureFn | None = None):
        if warmup < 1:
            raise ValueError(f"GraphedMicroStep: warmup must be >= 1 eager micro-steps, got {warmup}")
        self.model = model
        self.forward_backward = forward_backward
        self.device = device
        self.warmup = warmup
        self.capture = capture  # None: capture_cuda_graph (looked up when recording)
        self.replays = 0  # how many micro-steps ran from the graph (reports and tests read it)
        self.captures = 0
        self._replay: Callable[[], None] | None = None
        self._variant: Hashable = None
        self._eager_since_change = 0
        self._static: dict[str, torch.Tensor] | None = None  # "inputs", "labels" on the device
        self._loss: torch.Tensor | None = None
        self._grads: list[tuple[torch.nn.Parameter, torch.Tensor]] | None = None  # persistent buffers
        self._params_with_grads: list[torch.nn.Parameter] = []  # after the last eager micro-step

    def __call__(self, batch: dict, micro_step: int, *, eager: bool = False, variant: Hashable = None) -> torch.Tensor:
        """One micro-step: eager, or replayed. ``variant`` names the Python state the graph freezes
        beyond the model's own mode (the plan's BF16 switch): a new value records anew. Anything
        else that changes what the forward runs between steps must change it too."""
        variant = (variant, self.model.training)
        if variant != self._variant:  # e.g. the late BF16 switch: other kernels, other compiled graphs
            self._replay, self._variant, self._eager_since_change = None, variant, 0
            self._loss = None  # the dropped graph's pool is freed with its last reference
        if micro_step == 0 and self._grads is not None:
            self._restore_zeroed_grads()
        if eager or (self._replay is None and self._eager_since_change < self.warmup):
            loss = self.forward_backward(batch)
            self._params_with_grads = [p for p in self.model.parameters() if p.grad is not None]
            if not eager:
                self._eager_since_change += 1
            return loss
        self._load(batch)
        first_replay = self._replay is None
        if first_replay:
            self._record()
        self._replay()
        self.replays += 1
        if first_replay:
            self._check_gradient_buffers()
        return self._loss

    # ------------------------------------------------------------------------------------ parts
    def _load(self, batch: dict) -> None:
        """Copy the micro-batch into the static buffers the graph reads (created on first use)."""
        if self._static is None:
            self._static = {key: torch.empty_like(batch[key], device=self.device) for key in ("inputs", "labels")}
        for key, buffer in self._static.items():
            value = batch[key]
            if value.shape != buffer.shape or value.dtype != buffer.dtype:
                raise ValueError(f"parallel.cuda_graph: batch[{key!r}] is {tuple(value.shape)} {value.dtype}, but the "
                                 f"graph was recorded for {tuple(buffer.shape)} {buffer.dtype}; every micro-batch must "
                                 "have the same shape")
            buffer.copy_(value, non_blocking=True)

    def _record(self) -> None:
        """Capture forward + backward on the static buffers, with the gradients present.

        Nothing executes while capturing, so the gradients keep what earlier micro-steps of this
        step added (a capture may come at any micro-step) and the replay that follows adds this one.
        """
        if self._grads is None:
            # The parameters that received gradients in the warm-up get persistent buffers (the
            # ones of this step if it has them already): the optimizer sees what eager gives it,
            # and a parameter without a gradient keeps None.
            self._grads = [(p, p.grad if p.grad is not None else torch.zeros_like(p)) for p in self._params_with_grads]
            if not self._grads:
                raise RuntimeError("parallel.cuda_graph: no parameter received a gradient during the warm-up")
            for param, grad in self._grads:
                param.grad = grad
        static = self._static

        def step() -> torch.Tensor:
            self._loss = self.forward_backward(static)
            return self._loss

        try:
            self._replay = (self.capture or capture_cuda_graph)(step)
        except torch.OutOfMemoryError:
            raise  # the loop's out-of-memory advice applies as it is
        except Exception as error:
            raise RuntimeError(
                "parallel.cuda_graph: recording the forward + backward into a CUDA graph failed "
                f"({type(error).__name__}: {error}). Something in the step cannot be recorded, e.g. a "
                "synchronization with the host (stochastic rounding without the Triton kernels reads its "
                "seed on the host); run with parallel.cuda_graph=false") from error
        self.captures += 1

    def _check_gradient_buffers(self) -> None:
        """Every gradient the graph wrote lives in a persistent buffer: a parameter whose gradient
        appeared only while recording would hold memory of the graph's pool, never put back after
        the loop's zero_grad(set_to_none=True): it would silently stop training."""
        buffered = {id(param) for param, _ in self._grads}
        strays = [name for name, param in self.model.named_parameters()
                  if param.grad is not None and id(param) not in buffered]
        if strays:
            raise RuntimeError(f"parallel.cuda_graph: {len(strays)} parameter(s) received a gradient only in the "
                               f"recorded step, not in the warm-up (first: {strays[0]}); run with "
                               "parallel.cuda_graph=false")

    def _restore_zeroed_grads(self) -> None:
        """Put the persistent gradient buffers back on their parameters, zeroed (micro-step 0)."""
        for param, grad in self._grads:
            param.grad = grad
        torch._foreach_zero_([grad for _, grad in self._grads])
