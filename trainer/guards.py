"""Guards around the optimizer step: non-finite steps, loss spikes, preemption, OOM advice.

- A step whose loss or global gradient norm is not finite is skipped (no optimizer update;
  the batch is consumed) and counted. After `max_consecutive_skips` in a row the run saves a
  checkpoint and halts with an error: something is wrong beyond a one-off bad batch.
  The grad norm is the global one (reduced over ranks), so every rank decides alike.
- A loss spike (loss > spike_factor x its running mean) is logged as an event, nothing more.
- SIGTERM / SIGUSR1 (cluster preemption; SLURM sends them before the kill), SIGINT (Ctrl-C),
  SIGHUP (the terminal closed, an ssh connection dropped) and SIGQUIT (Ctrl-\\) set a flag; at the
  next step boundary all ranks agree (max-reduce), save a checkpoint and exit cleanly. torchrun's
  agent (torch 2.13, `--signals-to-handle` default SIGTERM,SIGINT,SIGHUP,SIGQUIT) passes each of
  these on to every worker as the same signal and sends SIGKILL `--shutdown-timeout` seconds later
  (30 by default): the workers' checkpoint must fit in that time. SIGUSR1 reaches workers under
  torchrun only when `--signals-to-handle` lists it; otherwise it ends torchrun, and a worker whose
  launcher is gone gets SIGTERM from the kernel (`stop_with_the_launcher`) and stops the same way. A second SIGINT exits at once (exit code
  130), without that checkpoint: every write is atomic (a save in progress is only a `.tmp_`
  directory), so nothing committed is touched. A second SIGTERM (SIGHUP, SIGQUIT) changes
  nothing (schedulers repeat it before their SIGKILL). After a SIGHUP the terminal may be gone: a
  message that cannot be written (EIO) sends the process's standard output and error to
  /dev/null, so that the prints of the coming save do not fail it.
- A failure that leaves the run unable to record what it does (metrics.jsonl or events.jsonl
  on rank 0 not writable: disk full) also stops at the boundary, after a checkpoint attempt,
  with `RunStopped` naming the file (`PreemptionFlag.requested(failure)`, `stop_after_failure`).
"""

from __future__ import annotations

import math
import os
import signal
import sys

import torch
import torch.distributed as dist


class NonFiniteHalt(RuntimeError):
    """Too many consecutive non-finite steps."""


class StepGuard:
    def __init__(self, max_consecutive_skips: int, spike_factor: float):
        self.max_consecutive_skips = max_consecutive_skips
        self.spike_factor = spike_factor
        self.skipped_total = 0
        self.skipped_in_a_row = 0
        self._loss_mean = None
        self._seen = 0

    def accept(self, loss: float, grad_norm: float) -> bool:
        """True when the update may be applied; counts skips otherwise."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.skipped_in_a_row = 0
            return True
        self.skipped_total += 1
        self.skipped_in_a_row += 1
        return False

    def must_halt(self) -> bool:
        return self.skipped_in_a_row >= self.max_consecutive_skips

    def is_spike(self, loss: float) -> bool:
        """Compare with the running mean (EMA over ~50 steps, armed after 10 steps), then update it."""
        if not math.isfinite(loss):
            return False
        spike = self._seen >= 10 and loss > self.spike_factor * self._loss_mean
        if not spike:  # a spike does not pull the mean up
            self._loss_mean = loss if self._loss_mean is None else 0.98 * self._loss_mean + 0.02 * loss
            self._seen += 1
        return spike

    def state_dict(self) -> dict:
        return {"skipped_total": self.skipped_total, "skipped_in_a_row": self.skipped_in_a_row,
                "loss_mean": self._loss_mean, "seen": self._seen}

    def load_state_dict(self, state: dict) -> None:
        self.skipped_total = state["skipped_total"]
        self.skipped_in_a_row = state["skipped_in_a_row"]
        self._loss_mean = state["loss_mean"]
        self._seen = state["seen"]


class RunStopped(RuntimeError):
    """The run stopped because it could not go on safely (e.g. its logs are not writable); the
    message says why and what was saved."""


INTERRUPT_EXIT_CODE = 130
"""Exit code after a second SIGINT (128 + SIGINT, as shells report an interrupted command)."""


class PreemptionFlag:
    """Set by SIGTERM/SIGUSR1/SIGINT; `requested()` is collective: every rank must call it each step."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

    def __init__(self, device: torch.device):
        self.device = device
        self.signal_name = None
        self.failure = None  # set by requested(): why the run must stop, when it is not a signal
        self._previous = {}
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        stop_with_the_launcher()

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        # os.write, not print: a handler may run while the main thread is inside print
        if signum == signal.SIGINT and self.signal_name == "SIGINT":
            os.write(2, b"\nsecond SIGINT: stopping now, without a checkpoint of this step; committed "
                        b"checkpoints are intact and the next start resumes from the newest\n")
            os._exit(INTERRUPT_EXIT_CODE)
        if signum == signal.SIGINT:
            _say(b"\nSIGINT: saving a checkpoint at the end of this step, then stopping "
                 b"(press Ctrl-C again to stop at once, without it)\n")
        elif signum in (signal.SIGHUP, signal.SIGQUIT) and self.signal_name is None:
            _say(f"\n{signal.Signals(signum).name}: saving a checkpoint at the end of this step, then stopping\n"
                 .encode())
        self.signal_name = signal.Signals(signum).name

    def requested(self, failure: str | None = None) -> bool:
        """Whether any rank was signalled or passes a `failure` (rank 0's reason to stop, e.g. its
        metrics file is not writable); a failure is then in `self.failure` on every rank."""
        code = 2 if failure else 1 if self.signal_name is not None else 0
        if dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([code], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            code = int(flag.item())
            if code == 2:
                shared = [failure]
                dist.broadcast_object_list(shared, src=0)  # the failing writer is rank 0 (the logger's)
                failure = shared[0]
        if code == 2:
            self.failure = failure or "a failure on another rank"
        return code > 0

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def stop_with_the_launcher() -> None:
    """Under torchrun: ask the kernel for SIGTERM when the launcher (this process's parent) dies (Linux
    prctl PR_SET_PDEATHSIG), so that a worker saves and stops at the next step boundary instead of training
    on orphaned. torchrun dies without telling its workers on a signal it does not pass on (SIGUSR1 unless
    --signals-to-handle lists it: the default action ends it) or on SIGKILL."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):
        return
    if launcher == 1 or os.getppid() != launcher:  # it died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


def _say(message: bytes) -> None:
    """Write to stderr from a signal handler; a terminal that is gone (EIO after a hangup) sends stdout and
    stderr to /dev/null instead, so that the prints of the coming save do not fail."""
    try:
        os.write(2, message)
    except OSError:
        null = os.open(os.devnull, os.O_WRONLY)
        for descriptor in (1, 2):
            try:
                os.dup2(null, descriptor)
            except OSError:
                pass
        os.close(null)


def stop_after_failure(checkpointer, step: int, failure: str) -> None:
    """Attempt a checkpoint of `step`, then raise RunStopped saying why the run stops and what was saved."""
    try:
        saved = checkpointer.save_now(step)
    except Exception as error:  # noqa: BLE001 - reported with the failure that stops the run
        raise RunStopped(f"{failure}; the checkpoint attempted at step {step} failed too: {error}") from error
    raise RunStopped(f"{failure}. Checkpoint {saved} holds step {step}; make the file writable (free space) "
                     "and start again to resume from it")


OOM_ADVICE = (
    "out of GPU memory. Knobs that reduce memory, roughly in order of cost: "
    "train.micro_batch_size (smaller; raise gradient accumulation via train.global_batch_size), "
    "parallel.activation_checkpoint=full (or 'M' / '-' for only Mamba or MLP blocks), "
    "more GPUs with parallel.dp_shard (FSDP2 shards params, grads and Adam states), "
    "data.seq_len (shorter sequences)."
)
