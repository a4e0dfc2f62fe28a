"""The trainer's entry point with faults installed, for tests that need a process to die at a chosen point.

    python -m tests.trainer.fault_entry [--kill-at-step=N] [--kill-during-save=N] [trainer overrides ...]

(or the same module under torchrun). The faults come from here, not from the product code:
  --kill-at-step=N      a callback exits once step N is done (logged, periodic checkpoint taken), on every rank
  --kill-during-save=N  `Checkpointer.on_shards_written` is replaced: exit while saving the checkpoint of
                        step N, every rank's shards written, the checkpoint not yet made visible
Both exit with EXIT_CODE through os._exit: no cleanup, no flush, like a crash.
"""

from __future__ import annotations

import os
import sys

EXIT_CODE = 17


def _take_option(arguments: list, name: str):
    """The integer value of --name=N in `arguments` (removed from it), or None."""
    prefix = f"--{name}="
    for argument in list(arguments):
        if argument.startswith(prefix):
            arguments.remove(argument)
            return int(argument[len(prefix):])
    return None


def main() -> None:
    arguments = sys.argv[1:]
    kill_at_step = _take_option(arguments, "kill-at-step")
    kill_during_save = _take_option(arguments, "kill-during-save")
    sys.argv = [sys.argv[0], *arguments]  # what is left is the trainer's (Hydra reads sys.argv)

    import trainer.checkpoint
    import trainer.loop
    from trainer.callbacks import Callback

    if kill_at_step is not None:
        class KillAtStep(Callback):
            def on_step_boundary(self, ctx):  # after everything step N does
                if ctx.state.step == kill_at_step:
                    os._exit(EXIT_CODE)

        plain_train = trainer.loop.train

        def train(cfg, callbacks=()):
            return plain_train(cfg, [*callbacks, KillAtStep()])

        trainer.loop.train = train  # trainer/__main__.py looks it up when it runs

    if kill_during_save is not None:
        def on_shards_written(self, step, tmp):
            if step == kill_during_save:
                os._exit(EXIT_CODE)

        trainer.checkpoint.Checkpointer.on_shards_written = on_shards_written

    from trainer.__main__ import cli

    cli()


if __name__ == "__main__":
    main()
