"""QuantizedLinear, the base every quantized linear backend shares: adoption, per-step state, compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from models.quant.fp8_torch import TorchFp8Linear
from models.quant.gemm_spec import fp8_tensor_linear_spec, nvfp4_linear_spec
from models.quant.linear import QuantLinear
from models.quant.quantized_linear import QuantizedLinear, mix_seed

BACKENDS = [(QuantLinear, nvfp4_linear_spec), (TorchFp8Linear, fp8_tensor_linear_spec)]


@pytest.mark.parametrize("linear_class, builder", BACKENDS)
def test_every_backend_adopts_the_very_parameters(linear_class, builder):
    linear = nn.Linear(32, 16)
    module = linear_class.from_linear(linear, builder(), name="layers.0.mixer.in_proj")
    assert isinstance(module, QuantizedLinear)
    assert module.weight is linear.weight and module.bias is linear.bias
    assert list(module.state_dict()) == ["weight", "bias"]


def test_set_step_writes_the_seed_of_seed_layer_step_rank_and_micro_batch():
    module = QuantLinear.from_linear(nn.Linear(32, 32, bias=False), nvfp4_linear_spec(), name="a")
    module.set_seed(1234, layer=3)
    module.set_step(7, rank=2)
    seed = module.sr_seed
    assert seed.dtype == torch.int64 and seed.shape == (1,)
    assert seed.item() == mix_seed(1234, 3, 7, 2) % 2**62 == mix_seed(1234, 3, 7, 2, micro_step=0) % 2**62
    module.set_micro_step(1)
    assert module.sr_seed is seed, "written in place: compiled code and CUDA graphs keep reading it"
    assert seed.item() == mix_seed(1234, 3, 7, 2, micro_step=1) % 2**62 != mix_seed(1234, 3, 7, 2) % 2**62
    assert module.rounding_rng() is seed and module.generator is None
    module.generator = torch.Generator().manual_seed(5)
    assert module.rounding_rng() is module.generator, "a generator set by hand takes precedence"
    assert list(module.state_dict()) == ["weight"], "the seed is not checkpointed: set_step rewrites it"
    rounding_free = QuantLinear.from_linear(nn.Linear(32, 32, bias=False),
                                            nvfp4_linear_spec(stochastic_rounding=False), name="b")
    rounding_free.set_step(7)
    assert rounding_free.step == 7 and rounding_free.sr_seed is None, "nothing to draw: no seed"


def test_seeded_draws_follow_the_micro_batch_and_differ_between_operands():
    """With the trainer's seed tensor (no generator), the stochastically rounded gradients depend on
    (step, micro-batch) only: the same micro-batch again rounds alike, the next one differently."""
    torch.manual_seed(0)
    module = QuantLinear.from_linear(nn.Linear(64, 32, bias=False), nvfp4_linear_spec(), name="a")
    module.set_seed(99, layer=1)
    x = torch.randn(64, 64)

    def weight_grad(step, micro_step):
        module.set_step(step)
        module.set_micro_step(micro_step)
        module.weight.grad = None
        torch.manual_seed(step * 10 + micro_step + 1)  # the global RNG must not matter
        module(x).pow(2).sum().backward()
        return module.weight.grad.clone()

    first = weight_grad(3, 0)
    assert torch.equal(first, weight_grad(3, 0))
    assert not torch.equal(first, weight_grad(3, 1)), "micro-batches draw independently"
    assert not torch.equal(first, weight_grad(4, 0)), "steps draw independently"
    from models.quant.linear import OPERAND_NAMES, operand_seed

    seed = torch.tensor([12345])
    offsets = {operand_seed(seed, name).item() for name in OPERAND_NAMES}
    assert len(offsets) == len(OPERAND_NAMES), "every operand of a layer has its own draws"
    # The seed arithmetic traces into one graph (the kernels' path; a host read or zlib call would not).
    compiled = torch.compile(lambda s: operand_seed(s, "Wgrad dY^T"), backend="eager", fullgraph=True)
    assert torch.equal(compiled(seed), operand_seed(seed, "Wgrad dY^T"))


@pytest.mark.parametrize("linear_class, builder", BACKENDS)
def test_layers_differing_only_in_name_share_one_compiled_graph(linear_class, builder):
    """Nothing on the forward's passing path reads the layer name: no recompile per layer.

    (The name used to be formatted into the shape checks' messages on every call, so Dynamo guarded
    on it and recompiled for each layer; past the recompile limit, 8, layers silently ran eager.)
    """
    import torch._dynamo

    spec = builder()
    layers = [linear_class.from_linear(nn.Linear(32, 32, bias=False), spec, name=f"layers.{i}.mixer.in_proj")
              for i in range(4)]
    for index, layer in enumerate(layers):
        layer.set_seed(0, layer=index)
        layer.set_step(1)

    def step(layer, x):
        return layer(x).sum()

    compiled = torch.compile(step, backend="eager")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for layer in layers:
            x = torch.randn(16, 32, requires_grad=True)
            compiled(layer, x).backward()
            assert x.grad is not None and layer.weight.grad is not None
    torch._dynamo.reset()
