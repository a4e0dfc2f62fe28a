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


def test_set_step_seeds_the_generator_from_seed_layer_step_and_rank():
    module = QuantLinear.from_linear(nn.Linear(32, 32, bias=False), nvfp4_linear_spec(), name="a")
    module.set_seed(1234, layer=3)
    module.set_step(7, rank=2)
    expected = torch.Generator().manual_seed(mix_seed(1234, 3, 7, 2))
    assert torch.equal(torch.rand(8, generator=module.generator), torch.rand(8, generator=expected))
    rounding_free = QuantLinear.from_linear(nn.Linear(32, 32, bias=False),
                                            nvfp4_linear_spec(stochastic_rounding=False), name="b")
    rounding_free.set_step(7)
    assert rounding_free.step == 7 and rounding_free.generator is None, "nothing to draw: no generator"


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
