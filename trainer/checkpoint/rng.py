"""Every RNG state of a process (python, numpy, torch CPU and CUDA) as JSON: what a checkpoint's
rng_rank{r}.json holds. JSON, never a pickle: a checkpoint file is read as data only."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import numpy as np
import torch


def _bytes_text(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


def _text_bytes(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def rng_state() -> dict:
    """Every RNG state as JSON-ready values (no pickle anywhere)."""
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(internal), gauss],
             "numpy": [kind, keys.tolist(), int(position), int(has_gauss), float(cached)],
             "torch": _bytes_text(torch.get_rng_state())}
    if torch.cuda.is_available():
        state["cuda"] = _bytes_text(torch.cuda.get_rng_state())
    return state


def read_rng_state(path: Path) -> dict:
    """The states written by `rng_state`; ValueError naming the file if it is not that."""
    try:
        state = json.loads(path.read_text())
        version, internal, gauss = state["python"]
        kind, keys, position, has_gauss, cached = state["numpy"]
        return {"python": (version, tuple(internal), gauss),
                "numpy": (kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached),
                "torch": _text_bytes(state["torch"]),
                "cuda": _text_bytes(state["cuda"]) if "cuda" in state else None}
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read the RNG states in {path}: {type(error).__name__}: {error}") from error


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
