"""Turn a training checkpoint into a Hugging Face NemotronH directory.

    python scripts/export_hf.py RUN_DIR/checkpoints/step_00001000 OUT_DIR [--dtype bfloat16]
        [--tokenizer PATH]

The checkpoint (Distributed Checkpoint, saved by any number of ranks) is loaded into one
unsharded model on the CPU, built from the model config recorded in its trainer_state.json;
models.hf.export_hf writes config.json and safetensors that
`transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` loads. The weights are the
master weights: the quantization of the training GEMMs is not part of the exported model.
`--tokenizer` copies a tokenizer.json (or an HF tokenizer directory) next to the weights.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import build_model  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from models.hf import export_hf  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_checkpoint_model(checkpoint: Path) -> torch.nn.Module:
    """The model of a trainer checkpoint, unsharded, in fp32 on the CPU."""
    import torch.distributed.checkpoint as dcp

    state_file = checkpoint / "trainer_state.json"
    if not (checkpoint / ".metadata").exists() or not state_file.exists():
        raise FileNotFoundError(f"{checkpoint} is not a complete checkpoint (needs .metadata and trainer_state.json)")
    trainer_state = json.loads(state_file.read_text())
    if "model_config" not in trainer_state:
        raise KeyError(f"{state_file} records no model_config (saved by an older trainer)")
    config = ModelConfig(**trainer_state["model_config"])
    with torch.device("meta"):
        model = build_model(config)
    model.to_empty(device="cpu")
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(checkpoint))  # reshards whatever the saving world size was
    model.load_state_dict(state["model"])
    return model.eval()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.json or an HF tokenizer directory")
    args = parser.parse_args(argv)
    model = load_checkpoint_model(args.checkpoint)
    out = export_hf(model, args.out_dir, dtype=DTYPES[args.dtype])
    if args.tokenizer is not None:
        if args.tokenizer.is_dir():
            for item in args.tokenizer.iterdir():
                if item.name.startswith("tokenizer") or item.name == "special_tokens_map.json":
                    shutil.copy(item, out / item.name)
        else:
            shutil.copy(args.tokenizer, out / "tokenizer.json")
    print(f"exported {sum(p.numel() for p in model.parameters()):,} parameters to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
