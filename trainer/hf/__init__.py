"""Interchange with Hugging Face transformers' NemotronH at the level of a run.

- load: `checkpoint.init_from_hf`: config.json decides the architecture, the weights go into
  the (possibly FSDP2-sharded) model through the distributed state-dict API
- export: a trainer checkpoint (`python -m trainer.export_hf`) or the end of a run
  (`checkpoint.export_hf_at_end`) as a Hugging Face directory with its tokenizer
- tokenizer: the training tokenizer as a transformers tokenizer, for those exports

One model's mapping (parameter names, config fields, the safetensors files) is models/hf.py,
which knows nothing of runs, checkpoints or tokenizers; this package joins it to the trainer's
checkpoints and distributed state and to the data package's tokenizer, as only the trainer
may import both.
"""
