"""Every block and quantized layer of a hybrid model compiles: no variant falls back to eager.

Dynamo caches compiled variants per function, shared by all blocks; past its recompile limit it
silently runs the rest eagerly (trainer/compile.py). The study's NVFP4 runs did (docs/study.md).
These tests compile with the "eager" backend: the same Dynamo tracing and guards, no codegen.
"""

import pytest
import torch
import torch.nn.functional as F

from models.hybrid import build_model
from models.quant.recipe import apply_precision
from trainer import compile as trainer_compile
from trainer.config import compose


@pytest.fixture(autouse=True)
def fresh_dynamo():
    import torch._dynamo

    saved = (torch._dynamo.config.recompile_limit, torch._dynamo.config.accumulated_recompile_limit)
    torch._dynamo.reset()
    trainer_compile._fallbacks.clear()
    yield
    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit, torch._dynamo.config.accumulated_recompile_limit = saved
    trainer_compile._fallbacks.clear()


def _train_and_evaluate(model, vocab_size: int, seq: int = 64) -> None:
    tokens = torch.randint(0, vocab_size, (1, seq + 1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens[:, :-1])


@pytest.mark.parametrize("overrides", [
    ["+experiment=study_nvfp4"],
    ["+experiment=study_nvfp4", "precision.format=mxfp4", "precision.name=mxfp4"],
], ids=["nvfp4", "mxfp4"])
def test_study_model_compiles_every_variant(overrides):
    from torch._dynamo.utils import counters

    cfg = compose(overrides)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    apply_precision(model, cfg.precision, device=torch.device("cpu"))
    limit = trainer_compile.apply_compile(model, backend="eager")
    assert limit > 8  # 16 blocks of three mixer types, BF16 and quantized, train and eval
    _train_and_evaluate(model, cfg.model.vocab_size)
    assert trainer_compile.compile_fallbacks() == []
    assert not any("recompile limit" in str(reason) for reason in counters["unimplemented"])


def test_a_function_past_the_limit_is_reported():
    import torch._dynamo

    def scale(x):
        return x * 2

    compiled = torch.compile(scale, backend="eager")
    trainer_compile._watch_dynamo()
    torch._dynamo.config.recompile_limit = 1
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        compiled(torch.ones(4, dtype=dtype))
    fallbacks = trainer_compile.compile_fallbacks()
    assert len(fallbacks) >= 1 and "scale" in fallbacks[0]


def _logits_and_gradients(model, tokens):
    """Forward under bf16 autocast, the loss's backward outside it (as the trainer runs them)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("overrides", [
    ["precision.gradient_stochastic_rounding=false"],  # RNE everywhere: compiled must equal eager bit for bit
    ["precision.format=fp8_block", "precision.name=fp8_block", "precision.backend=emulated",
     "precision.fp8_power_of_two_scales=false"],  # the emulation's fp32 GEMM path
], ids=["nvfp4", "fp8_block-fp32-gemms"])
def test_quantized_linears_compile_into_the_block_graphs(overrides):
    """No graph break around a quantized linear, and the compiled model computes what eager does.

    A break sends each quantized linear eager between compiled pieces (on the H200 the study-size
    NVFP4 step then left the GPU idle 150 of 184 ms). Two causes were found: a module global set on
    first use (torch.mm's out_dtype probe) and out= ops into strided views in the torch quantizer.
    Without the breaks, two autocast mistakes show here ("aot_eager" traces the backward as the
    trainer's Inductor does, without code generation):
    - an autocast context around the autograd function's whole backward made Dynamo leave
      autocast off after the first quantized layer (k/v projections in fp32): the logits differ;
    - with autocast switched off only around the function, its backward was traced under the
      forward's autocast, and the fp32 GEMMs of the emulation ran in bf16: the gradients differ.

    Stochastic rounding is off here so that eager and compiled draw nothing (the GPU test
    ``test_quant_linear_compiled_with_inductor_matches_eager`` compiles it, seed tensor included).
    """
    from torch._dynamo.utils import counters

    cfg = compose(["+experiment=study_nvfp4", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    apply_precision(model, cfg.precision, device=torch.device("cpu"))
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 65))
    expected_logits, expected_grads = _logits_and_gradients(model, tokens)
    counters.clear()
    trainer_compile.apply_compile(model, backend="aot_eager")
    logits, grads = _logits_and_gradients(model, tokens)
    assert dict(counters["graph_break"]) == {}
    assert logits.dtype == expected_logits.dtype
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=0)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}")
