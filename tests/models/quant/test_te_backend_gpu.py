"""The Transformer Engine backend end to end on a GPU where TE imports (FP8 recipes run on Hopper)."""

from __future__ import annotations

import pytest
import torch

from models.quant import te_backend

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not te_backend.has_te(), reason="Transformer Engine does not import")]


def _tiny128():
    from models import ModelConfig

    return ModelConfig(name="tiny128", pattern="M-M*M-", vocab_size=256, hidden_size=128, ffn_hidden_size=256,
                       num_attention_heads=4, num_key_value_heads=2, attention_head_dim=64, mamba_num_heads=128,
                       mamba_head_dim=2, ssm_state_size=64, mamba_num_groups=1, conv_kernel=4, chunk_size=64)


def test_te_float8_block_scaling_trains_and_keeps_bf16_layers_plain():
    import transformer_engine.pytorch as te

    from models import build_model
    from models.quant.config import PrecisionConfig
    from models.quant.recipe import apply_precision

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = build_model(_tiny128())
    model.init_weights()
    reference = {name: p.detach().clone() for name, p in model.named_parameters()}
    parameters = dict(model.named_parameters())
    cfg = PrecisionConfig(name="fp8", format="fp8_block", backend="te", bf16_layers_at_start=1, bf16_layers_at_end=1)
    plan = apply_precision(model, cfg)
    assert plan.backend == "te"
    converted = [n for n, m in model.named_modules() if isinstance(m, te.Linear)]
    assert converted and all(not n.startswith(("layers.0.", "layers.5.")) for n in converted)
    assert isinstance(model.layers[0].mixer.in_proj, torch.nn.Linear) and not isinstance(model.layers[0].mixer.in_proj, te.Linear)
    for name, param in model.named_parameters():  # the swap keeps every weight: the same Parameter objects
        assert param is parameters[name], name
        torch.testing.assert_close(param.detach(), reference[name], rtol=0, atol=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 256, (2, 129), device="cuda")
    losses = []
    for _ in range(8):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    te_weight = model.get_submodule(converted[0]).weight
    assert te_weight is parameters[converted[0] + ".weight"] and not torch.equal(te_weight, reference[converted[0] + ".weight"])
    # Late switch: TE's autocast turns off and the layers run in BF16.
    plan.switch_to_bf16("forward_backward")
    assert plan.te_autocast.enabled is False and plan.summary()["switched_to_bf16"]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.isfinite(model(tokens[:, :-1])).all()


def test_te_nvfp4_is_refused_on_hopper_with_a_clear_message():
    from models.quant.config import PrecisionConfig
    from models.quant.recipe import resolve_backend

    if torch.cuda.get_device_capability() >= (10, 0):
        pytest.skip("this GPU runs NVFP4 natively")
    with pytest.raises(RuntimeError, match="compute capability 10.0"):
        resolve_backend(PrecisionConfig(name="nvfp4", format="nvfp4", backend="te"), torch.device("cuda"))
    # auto falls back to the emulation on Hopper
    assert resolve_backend(PrecisionConfig(name="nvfp4", format="nvfp4", backend="auto"), torch.device("cuda")) == "emulated"
