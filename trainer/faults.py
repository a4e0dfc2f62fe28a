"""Fault injection for tests: die hard at a chosen point, as a crash or SIGKILL would.

Set in the environment of a training process:
  HYBRID_TEST_KILL_AT_STEP=N         exit once step N is done (logged, periodic checkpoint taken)
  HYBRID_TEST_KILL_DURING_SAVE=N     exit while saving the checkpoint of step N: shards written,
                                     the checkpoint not yet made visible
Unset (the normal case) they cost one dictionary lookup per step.
"""

from __future__ import annotations

import os

KILL_AT_STEP = "HYBRID_TEST_KILL_AT_STEP"
KILL_DURING_SAVE = "HYBRID_TEST_KILL_DURING_SAVE"
EXIT_CODE = 17


def maybe_kill(variable: str, step: int) -> None:
    if os.environ.get(variable) == str(step):
        os._exit(EXIT_CODE)  # no cleanup, no flush: like a crash
