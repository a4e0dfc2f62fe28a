"""Turn a training checkpoint into a Hugging Face NemotronH directory, tokenizer included.

    python -m trainer.export_hf RUN_DIR/checkpoints/step_00001000 OUT_DIR [--dtype bfloat16]
        [--tokenizer PATH] [--overwrite] [--no-verify]

Writes safetensors weights, config.json, generation_config.json, tokenizer.json and
tokenizer_config.json, so that `AutoTokenizer.from_pretrained(OUT_DIR)` and
`AutoModelForCausalLM.from_pretrained(OUT_DIR).generate(...)` work and generation stops on the
EOS that ended every training document. The tokenizer is the one the checkpoint records (path
and sha256); `--tokenizer` points at a copy of it when that path is gone (it must hash the
same). OUT_DIR must be new or empty: stale files of an earlier export would be read with the
new ones; `--overwrite` empties it first (a directory of files only). The checkpoint is verified
against its integrity.json first, as a resume does: a damaged one is refused naming the file
(exit status 2, as for every error of the user's); `--no-verify` checks sizes only. The work is
trainer.hf.export.export_checkpoint (checkpoint.export_hf_at_end does the same at the end of a run).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trainer.checkpoint.errors import CheckpointError
from trainer.hf.export import DTYPES, export_checkpoint


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.export_hf", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory (RUN_DIR/checkpoints/step_XXXXXXXX)")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="the training tokenizer (tokenizer.json or an HF tokenizer directory) when the recorded "
                             "path is gone; must hash as recorded")
    parser.add_argument("--overwrite", action="store_true",
                        help="empty OUT_DIR first when it holds files (of an earlier export); without it a non-empty "
                             "OUT_DIR is refused")
    parser.add_argument("--no-verify", action="store_true",
                        help="check the files' sizes only, not their sha256 against integrity.json (and accept a "
                             "checkpoint saved without it): a knowing choice, as checkpoint.verify=false for a resume")
    args = parser.parse_args(argv)
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir, args.dtype, args.tokenizer, args.overwrite,
                                verify=not args.no_verify)
    except (FileNotFoundError, KeyError, ValueError, CheckpointError) as error:  # the user's to fix: one line
        parser.exit(2, f"export_hf: {error}\n")
    print(f"exported {args.checkpoint} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
