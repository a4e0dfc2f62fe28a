"""What may differ between a checkpoint and the run resuming it, besides the model (compatibility.py).

A checkpoint's trainer_state.json records the run's tokenizer (its identity: sha256, vocabulary
size, EOS id), its corpus (per source, the hash of the prepared manifest's shard list: the
sha256 of every shard) and its whole resolved config. On resume:

- tokenizer and corpus: a change is refused, naming both sides, unless allowed on purpose by
  `checkpoint.allow_tokenizer_change` / `checkpoint.allow_data_change`; an allowed change is
  an event (`tokenizer_changed_on_resume`, `data_changed_on_resume`) with both values.
- every other config value (steps, schedule, precision, batch, ...) and the world size may
  change; each change is one entry of a `config_changed_on_resume` event with the old and new
  value, and a changed schedule adds the learning rate at the resumed step under both.
- `train.steps` below the resumed step is refused (nothing would be trained); equal to it, the
  run says there is nothing left to train.
- each start keeps its resolved config: config.yaml and run_info.json are the first start's,
  a later start writes config.resume-<step>.yaml and run_info.resume-<step>.json beside them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

TOKENIZER_KEYS = ("sha256", "vocab_size", "eos_id")
"""What makes two tokenizers encode differently (the name and path may differ)."""


def _tokenizer_text(record: dict) -> str:
    return (f"{record.get('name')!r} (sha256 {str(record.get('sha256'))[:16]}..., vocab {record.get('vocab_size')}, "
            f"eos {record.get('eos_id')}, {record.get('path')})")


def data_changes(saved: dict, current: dict, cfg) -> Tuple[List[str], Dict[str, dict]]:
    """(refused changes, allowed changes by kind) between a checkpoint's records and the run's.

    saved: the checkpoint's trainer_state; current: the run's records (CheckpointedState.records);
    cfg: CheckpointConfig (allow_tokenizer_change, allow_data_change). Checkpoints that predate a
    record are not compared on it.
    """
    refused, allowed = [], {}
    old, new = saved.get("tokenizer"), current.get("tokenizer")
    if old and new and any(old.get(key) != new.get(key) for key in TOKENIZER_KEYS):
        if cfg.allow_tokenizer_change:
            allowed["tokenizer"] = {"old": old, "new": new, "option": "checkpoint.allow_tokenizer_change"}
        else:
            refused.append(f"tokenizer: checkpoint {_tokenizer_text(old)}, this run {_tokenizer_text(new)} "
                           "(allow on purpose with checkpoint.allow_tokenizer_change=true)")
    old, new = saved.get("corpus"), current.get("corpus")
    if old and new:
        sources = {}
        for name in sorted(set(old) | set(new)):
            was, now = old.get(name), new.get(name)
            if (was or {}).get("sha256") != (now or {}).get("sha256"):
                sources[name] = {"old": was, "new": now}
        if sources and cfg.allow_data_change:
            allowed["corpus"] = {"sources": sources, "option": "checkpoint.allow_data_change"}
        elif sources:
            described = "; ".join(
                f"source {name!r}: checkpoint {_corpus_text(change['old'])}, this run {_corpus_text(change['new'])}"
                for name, change in sources.items())
            refused.append(f"corpus: {described} (allow on purpose with checkpoint.allow_data_change=true)")
    return refused, allowed


def _corpus_text(identity: Optional[dict]) -> str:
    if not identity:
        return "absent"
    return f"{identity.get('manifest')} (shards sha256 {str(identity.get('sha256'))[:16]}...)"


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        flat = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: value}


def config_changes(saved_config: Optional[dict], config: dict) -> Dict[str, list]:
    """{dotted key: [old, new]} for every config value that differs (lists compared whole)."""
    if not saved_config:
        return {}
    old, new = _flatten(saved_config), _flatten(config)
    return {key: [old.get(key), new.get(key)] for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)}


def _lr_at(config: dict, step: int) -> Optional[float]:
    from trainer.config import OptimConfig
    from trainer.optim import lr_at

    try:
        return lr_at(step, config["train"]["steps"], OptimConfig(**config["optim"]))
    except (KeyError, TypeError, ValueError):
        return None


def resume_events(saved: dict, cfg, world_size: int) -> List[Tuple[str, dict]]:
    """(event name, fields) for every allowed difference between the checkpoint (`saved`, its
    trainer_state as loaded) and this run: data changes, config changes, world size."""
    events = []
    changes = saved.get("data_changes", {})
    if "tokenizer" in changes:
        events.append(("tokenizer_changed_on_resume", changes["tokenizer"]))
    if "corpus" in changes:
        events.append(("data_changed_on_resume", changes["corpus"]))
    config = json.loads(json.dumps(dataclasses.asdict(cfg)))  # as trainer_state.json holds it (tuples: lists)
    changed = config_changes(saved.get("config"), config)
    if saved.get("world_size") not in (None, world_size):
        changed["world_size"] = [saved["world_size"], world_size]
    if changed:
        fields = {"changes": changed}
        if any(key.startswith("optim.") or key == "train.steps" for key in changed):
            old_lr, new_lr = _lr_at(saved["config"], saved["step"]), _lr_at(config, saved["step"])
            if old_lr != new_lr:
                fields["lr_at_resume"] = [old_lr, new_lr]
        events.append(("config_changed_on_resume", fields))
    return events


def check_steps_left(resumed_step: int, steps: int, path: Path, is_main: bool) -> None:
    """Refuse train.steps below the resumed step; say so when it equals it (nothing left to train)."""
    from trainer.validate import ConfigError

    if steps < resumed_step:
        raise ConfigError(f"train.steps={steps} is below step {resumed_step}, where checkpoint {path} stands: nothing "
                          "would be trained. Raise train.steps to continue, or resume an earlier checkpoint with "
                          "checkpoint.resume=<path>")
    if steps == resumed_step and is_main:
        print(f"train.steps={steps} is reached already (checkpoint {path} is at step {resumed_step}): nothing left "
              "to train", flush=True)


def start_record_names(run_dir: Path, step: int) -> Tuple[str, str]:
    """(config file, run description file) of this start: config.yaml and run_info.json for the first,
    config.resume-<step>.yaml and run_info.resume-<step>.json (-2, -3... if taken) for each later one."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        return "config.yaml", "run_info.json"
    stem, number = f"resume-{step:08d}", 1
    while (run_dir / f"config.{stem}.yaml").exists() or (run_dir / f"run_info.{stem}.json").exists():
        number += 1
        stem = f"resume-{step:08d}-{number}"
    return f"config.{stem}.yaml", f"run_info.{stem}.json"
