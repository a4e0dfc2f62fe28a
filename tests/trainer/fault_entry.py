"""The trainer's entry point with faults installed, for tests that need a process to die at a chosen point.

    python -m tests.trainer.fault_entry [--kill-at-step=N] [--kill-during-save=N] [--signal-at-step=N:SIG]
        [--signals-during-save=N:SIG:COUNT] [--kill-on-second-commit=N] [trainer overrides ...]

(or the same module under torchrun). The faults come from here, not from the product code:
  --kill-at-step=N      a callback exits once step N is done (logged, periodic checkpoint taken), on every rank
  --kill-during-save=N  `Checkpointer.on_shards_written` is replaced: exit while saving the checkpoint of
                        step N, every rank's shards written, the checkpoint not yet made visible
  --kill-on-second-commit=N  `os.rename` is wrapped: exit when `.tmp_step_N` is renamed for the second time,
                        i.e. between a second save's handling of the committed `step_N` and its own commit
These exit with EXIT_CODE through os._exit: no cleanup, no flush, like a crash.
  --signal-at-step=N:SIG  a callback sends signal SIG (e.g. SIGINT) to its own process as step N starts
  --signals-during-save=N:SIG:COUNT  `on_shards_written` sends SIG COUNT times (50 ms apart) while step N is saved
"""

from __future__ import annotations

import os
import signal
import sys
import time

EXIT_CODE = 17


def _take_option(arguments: list, name: str, convert=int):
    """The value of --name=VALUE in `arguments` (removed from it), converted, or None."""
    prefix = f"--{name}="
    for argument in list(arguments):
        if argument.startswith(prefix):
            arguments.remove(argument)
            return convert(argument[len(prefix):])
    return None


def _fields(text: str) -> list:
    """'2:SIGINT:3' -> [2, Signals.SIGINT, 3]."""
    return [getattr(signal, part) if part.startswith("SIG") else int(part) for part in text.split(":")]


def main() -> None:
    arguments = sys.argv[1:]
    kill_at_step = _take_option(arguments, "kill-at-step")
    kill_during_save = _take_option(arguments, "kill-during-save")
    kill_on_second_commit = _take_option(arguments, "kill-on-second-commit")
    signal_at_step = _take_option(arguments, "signal-at-step", _fields)
    signals_during_save = _take_option(arguments, "signals-during-save", _fields)
    sys.argv = [sys.argv[0], *arguments]  # what is left is the trainer's (Hydra reads sys.argv)

    import trainer.checkpoint.checkpointer
    import trainer.loop
    from trainer.callbacks import Callback

    callbacks = []
    if kill_at_step is not None:
        class KillAtStep(Callback):
            def on_step_boundary(self, ctx):  # after everything step N does
                if ctx.state.step == kill_at_step:
                    os._exit(EXIT_CODE)

        callbacks.append(KillAtStep())

    if signal_at_step is not None:
        class SignalAtStep(Callback):
            def on_step_start(self, ctx):  # ctx.state.step counts the steps done
                if ctx.state.step + 1 == signal_at_step[0]:
                    os.kill(os.getpid(), signal_at_step[1])

        callbacks.append(SignalAtStep())

    if callbacks:
        plain_train = trainer.loop.train

        def train(cfg, extra=(), **options):  # options: the entry point's (run directory, Hydra's files)
            return plain_train(cfg, [*extra, *callbacks], **options)

        trainer.loop.train = train  # trainer/__main__.py looks it up when it runs

    if kill_during_save is not None or signals_during_save is not None:
        def on_shards_written(self, step, tmp):
            if step == kill_during_save:
                os._exit(EXIT_CODE)
            if signals_during_save is not None and step == signals_during_save[0]:
                for _ in range(signals_during_save[2]):
                    os.kill(os.getpid(), signals_during_save[1])
                    time.sleep(0.05)  # each signal is handled before the next (pending ones would merge)

        trainer.checkpoint.checkpointer.Checkpointer.on_shards_written = on_shards_written

    if kill_on_second_commit is not None:
        renames = []
        plain_rename = os.rename

        def rename(source, target, *args, **kwargs):
            if os.path.basename(os.fspath(source)) == f".tmp_step_{kill_on_second_commit:08d}":
                renames.append(source)
                if len(renames) == 2:
                    os._exit(EXIT_CODE)
            return plain_rename(source, target, *args, **kwargs)

        os.rename = rename

    from trainer.__main__ import cli

    cli()


if __name__ == "__main__":
    main()
