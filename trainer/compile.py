"""torch.compile per block, sized so that no block or layer silently falls back to eager.

Dynamo keeps one cache of compiled variants per *code object*, not per module: every block
shares `Block.forward`, every quantized linear shares its class's `forward`, and each mixer
class shares its own. A hybrid model needs several variants of the same function: one per mixer
type, per precision (BF16 blocks at the ends, quantized in the middle), for training and for
evaluation (no_grad). Past `torch._dynamo.config.recompile_limit` variants (8 by default) Dynamo
stops compiling that function and runs every later variant eagerly, logging one warning. The
numbers stay the same, only slower, which is why it went unnoticed: the study's NVFP4 runs
(16 blocks) hit it in `Block.forward` and in the quantized linear's `forward` (docs/study.md).

`apply_compile` therefore raises the limit to a bound taken from the model (two variants,
training and evaluation, for every module inside the blocks), and records any function that
still hits it: `compile_fallbacks()` lists them and each one is logged as an error naming it.
"""

from __future__ import annotations

import logging

from torch import nn

log = logging.getLogger(__name__)

_fallbacks: list[str] = []  # "function (file:line)" of every function Dynamo gave up on, in order
_watching = False


class _RecompileLimitWatcher(logging.Handler):
    """Catches Dynamo's "hit config.recompile_limit" warning and names the function it gave up on."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "recompile_limit" not in message:
            return
        lines = [line.strip() for line in message.splitlines()]
        function = next((line.removeprefix("function:").strip() for line in lines if line.startswith("function:")),
                        lines[0])
        _fallbacks.append(function)
        log.error("torch.compile gave up on %s: it now runs eagerly (same numbers, slower). "
                  "Its variants exceed torch._dynamo.config.recompile_limit; see trainer/compile.py", function)


def _watch_dynamo() -> None:
    global _watching
    if not _watching:
        logging.getLogger("torch._dynamo.convert_frame").addHandler(_RecompileLimitWatcher(level=logging.WARNING))
        _watching = True


def recompile_limit_for(model: nn.Module) -> int:
    """Two variants (training, evaluation) for every module inside the blocks: an upper bound."""
    modules_in_blocks = sum(1 for block in model.layers for _ in block.modules())
    return 2 * modules_in_blocks


def apply_compile(model: nn.Module, backend: str | None = None) -> int:
    """Compile every block separately (small graphs, names unchanged); returns the recompile limit set.

    ``backend`` is torch.compile's (inductor when None); tests use "eager" to check the variants
    without code generation.
    """
    import torch._dynamo

    needed = recompile_limit_for(model)
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, needed)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * needed)
    _watch_dynamo()
    for block in model.layers:
        if backend is None:
            block.compile()
        else:
            block.compile(backend=backend)
    return config.recompile_limit


def compile_fallbacks() -> list[str]:
    """Functions Dynamo stopped compiling in this process (empty when every variant compiled)."""
    return list(_fallbacks)
