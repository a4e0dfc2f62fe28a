"""parallel.cuda_graph on the CPU: the bookkeeping around the graph (warm-up, persistent gradients,
eager diagnostics steps, recapture after the late BF16 switch) gives eager's training exactly.

A stand-in replaces the CUDA capture: it records nothing and its replay calls the step again, so
what is tested here is everything but the recording (tests/trainer/test_cuda_graph_gpu.py records).
"""

from __future__ import annotations

import pytest
import torch

import trainer.cuda_graph as cuda_graph
import trainer.loop as loop
from tests.trainer.trainer_testing import compose_train_config, read_jsonl, tiny_overrides
from trainer.cuda_graph import GraphedMicroStep, check_cuda_graph_supported
from trainer.distributed import DistEnv
from trainer.loop import train
from trainer.validate import ConfigError


class StandInCapture:
    """capture(fn) -> replay; counts recordings and replays. Like a real capture it runs nothing."""

    def __init__(self):
        self.captures = self.replays = 0

    def __call__(self, fn):
        self.captures += 1

        def replay():
            self.replays += 1
            fn()

        return replay


def _final_parameters(summary_holder):
    class Keep(loop.Callback):
        def on_step_end(self, ctx, metrics):
            summary_holder["params"] = {name: p.detach().clone() for name, p in ctx.model.named_parameters()}
    return Keep()


def test_graphed_training_equals_eager(tmp_path, data_cache, monkeypatch):
    # 9 steps of 2 micro-batches; diagnostics due at step indices 2, 5, 8 (eager); BF16 from step 5 (recorded anew).
    overrides = tiny_overrides(data_cache, steps=9) + ["precision.switch_to_bf16_at_step=5",
                                                        "logging.quant_diagnostics_every=3"]
    results = {}
    capture = StandInCapture()
    for graphed in (False, True):
        if graphed:
            monkeypatch.setattr(loop, "check_cuda_graph_supported", lambda *args: None)  # the CPU is refused
            monkeypatch.setattr(cuda_graph, "capture_cuda_graph", capture)
        run_dir = tmp_path / ("graphed" if graphed else "eager")
        cfg = compose_train_config(overrides + [f"parallel.cuda_graph={str(graphed).lower()}"], run_dir)
        holder = {}
        summary = train(cfg, callbacks=[_final_parameters(holder)])
        results[graphed] = (summary, holder["params"], read_jsonl(run_dir / "quant_diagnostics.jsonl"))
    (eager, eager_params, eager_diag), (graphed, graphed_params, graphed_diag) = results[False], results[True]
    assert graphed["losses"] == eager["losses"]  # bit for bit
    for name, value in eager_params.items():
        assert torch.equal(graphed_params[name], value), name
    # The diagnostics steps ran eagerly: their hooks saw the same operands.
    assert [line["step"] for line in graphed_diag] == [3, 6, 9]
    assert graphed_diag == eager_diag
    # (step, micro-step): warm-up (0,0) (0,1) (1,0) eager, recorded at (1,1); step 2 eager
    # (diagnostics); BF16 from step 5, itself eager (diagnostics): warm-up (6,0) (6,1) (7,0),
    # recorded again at (7,1); step 8 eager (diagnostics).
    assert capture.captures == 2
    recorded = [(e["step"], e["micro_step"], e["switched_to_bf16"]) for e in read_jsonl(tmp_path / "graphed" / "events.jsonl")
                if e["event"] == "cuda_graph_recorded"]
    assert recorded == [(1, 1, False), (7, 1, True)]
    replayed_micro_steps = {(1, 1), (3, 0), (3, 1), (4, 0), (4, 1), (7, 1)}
    assert capture.replays == len(replayed_micro_steps)


def test_gradients_of_unused_parameters_stay_none():
    """Only parameters that got gradients in the warm-up get buffers: AdamW skips a None gradient,
    a zero one would still decay and move its moments."""
    used, unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    model = torch.nn.ModuleDict({"used": used, "unused": unused})

    def forward_backward(batch):
        loss = used(batch["inputs"].float()).square().mean()
        loss.backward()
        return loss.detach()

    graphed = GraphedMicroStep(model, forward_backward, torch.device("cpu"), warmup=1, capture=StandInCapture())
    batch = {"inputs": torch.randn(2, 4), "labels": torch.zeros(2, 4)}
    graphed(batch, 0)  # warm-up, eager
    model.zero_grad(set_to_none=True)
    graphed(batch, 0)  # recorded and replayed
    assert used.weight.grad is not None and unused.weight.grad is None
    expected = used.weight.grad.clone()
    model.zero_grad(set_to_none=True)  # as the loop does after every step
    graphed(batch, 0)  # buffers put back, zeroed, then accumulated into
    assert torch.equal(used.weight.grad, expected)


def _one_linear(capture) -> GraphedMicroStep:
    """A 4 -> 4 linear whose micro-step sums its output, behind GraphedMicroStep with one warm-up."""
    model = torch.nn.Linear(4, 4)

    def forward_backward(batch):
        loss = model(batch["inputs"]).sum()
        loss.backward()
        return loss.detach()

    return GraphedMicroStep(model, forward_backward, torch.device("cpu"), warmup=1, capture=capture)


def test_a_batch_of_another_shape_is_refused():
    graphed = _one_linear(StandInCapture())
    graphed({"inputs": torch.randn(2, 4), "labels": torch.zeros(2)}, 0)
    graphed({"inputs": torch.randn(2, 4), "labels": torch.zeros(2)}, 0)
    with pytest.raises(ValueError, match=r"batch\['inputs'\] is \(3, 4\)"):
        graphed({"inputs": torch.randn(3, 4), "labels": torch.zeros(3)}, 0)


def test_a_failed_capture_names_the_option():
    def failing_capture(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphed = _one_linear(failing_capture)
    graphed({"inputs": torch.randn(2, 4), "labels": torch.zeros(2)}, 0)
    with pytest.raises(RuntimeError, match="parallel.cuda_graph=false"):
        graphed({"inputs": torch.randn(2, 4), "labels": torch.zeros(2)}, 0)


def test_out_of_memory_while_recording_stays_out_of_memory():
    """The loop turns torch.OutOfMemoryError into its advice; the capture must not rename it."""
    def capture_out_of_memory(fn):
        raise torch.OutOfMemoryError("CUDA out of memory while capturing")

    graphed = _one_linear(capture_out_of_memory)
    graphed({"inputs": torch.randn(2, 4), "labels": torch.zeros(2)}, 0)
    with pytest.raises(torch.OutOfMemoryError):
        graphed({"inputs": torch.randn(2, 4), "labels": torch.zeros(2)}, 0)


def test_a_gradient_first_seen_in_the_recorded_step_is_refused():
    """Its .grad would live in the graph's pool and never be put back after zero_grad(set_to_none)."""
    first, late = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    model = torch.nn.ModuleDict({"first": first, "late": late})
    calls = []

    def forward_backward(batch):
        calls.append(1)
        out = first(batch["inputs"])
        if len(calls) > 1:  # the warm-up (call 1) leaves `late` out
            out = late(out)
        loss = out.sum()
        loss.backward()
        return loss.detach()

    graphed = GraphedMicroStep(model, forward_backward, torch.device("cpu"), warmup=1, capture=StandInCapture())
    graphed({"inputs": torch.randn(2, 4), "labels": torch.zeros(2)}, 0)
    model.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match=r"late\.weight"):
        graphed({"inputs": torch.randn(2, 4), "labels": torch.zeros(2)}, 0)


def test_where_cuda_graphs_are_refused(tmp_path, data_cache):
    cuda = torch.device("cuda")
    with pytest.raises(ValueError, match="CUDA device"):
        check_cuda_graph_supported(DistEnv(0, 0, 1, torch.device("cpu")), {"fsdp": False}, "emulated")
    with pytest.raises(ValueError, match="world size 2, FSDP on"):
        check_cuda_graph_supported(DistEnv(0, 0, 2, cuda), {"fsdp": True}, "emulated")
    with pytest.raises(ValueError, match="Transformer Engine"):
        check_cuda_graph_supported(DistEnv(0, 0, 1, cuda), {"fsdp": False}, "te")
    check_cuda_graph_supported(DistEnv(0, 0, 1, cuda), {"fsdp": False}, "torch")  # accepted
    with pytest.raises(ConfigError, match="parallel.device"):
        train(compose_train_config(tiny_overrides(data_cache) + ["parallel.cuda_graph=true", "parallel.device=cpu"],
                                   tmp_path))
    with pytest.raises(ConfigError, match="parallel.fsdp"):
        train(compose_train_config(tiny_overrides(data_cache) + ["parallel.cuda_graph=true", "parallel.fsdp=on"],
                                   tmp_path))
    with pytest.raises(ConfigError, match="parallel.activation_checkpoint"):
        train(compose_train_config(tiny_overrides(data_cache) + ["parallel.cuda_graph=true",
                                                                 "parallel.activation_checkpoint=full"], tmp_path))
    if not torch.cuda.is_available():  # device auto resolves to the CPU here: refused once known
        with pytest.raises(ValueError, match="needs a CUDA device"):
            train(compose_train_config(tiny_overrides(data_cache) + ["parallel.cuda_graph=true"], tmp_path / "auto"))
