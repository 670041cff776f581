"""A CLI run with hooks (tests/test_reliability_encoder_decision.py, tests/test_interrupts.py). Run as a file so the
spawned decision child imports it as __mp_main__ too: the ATK_SLOW_* hooks apply in the child."""
import os
import signal
import sys
import threading
import time

from packtrain.pipeline.encode.fast import encoder_decision, fastokens_encoder, probe, tiktoken_encoder

if os.environ.get("ATK_SLOW_CHECKS"):  # the structural checks take this long (in the child, and in the build's
    # process, which makes them itself while its decision's child waits for the workers: EncoderDecision.guess)
    _structure = tiktoken_encoder.structure
    tiktoken_encoder.structure = lambda spec: (time.sleep(float(os.environ["ATK_SLOW_CHECKS"])), _structure(spec))[1]
if os.environ.get("ATK_SLOW_PROOF"):  # in the child: the proof takes this long
    _merges = tiktoken_encoder.merges_match_ranks
    tiktoken_encoder.merges_match_ranks = lambda *a: (time.sleep(float(os.environ["ATK_SLOW_PROOF"])), _merges(*a))[1]
if os.environ.get("ATK_CHILD_RAISES"):  # in the child: the proof raises after the checks passed
    def _boom(*a, **k):
        raise MemoryError("simulated")
    probe.probe_text = _boom

if os.environ.get("ATK_COUNT_PROBES"):  # in the child: each proof's probe through the HF tokenizer, one line per
    # call in this file (tests/test_machine_proofs.py counts them)
    def _counted(real):
        def counted(*a, **k):
            with open(os.environ["ATK_COUNT_PROBES"], "a") as f:
                f.write(f"{os.getpid()}\n")
            return real(*a, **k)
        return counted
    fastokens_encoder.probe_difference = _counted(fastokens_encoder.probe_difference)
    tiktoken_encoder.probe_difference = _counted(tiktoken_encoder.probe_difference)

if os.environ.get("ATK_SIGNAL_AT_STEP"):  # in step N's forward, these signals (tests/test_interrupts.py): INT as
    # Ctrl-C sends it (to the whole process group), TERM as SLURM or Kubernetes (to the process)
    import packtrain.trainer.loop as _loop

    _forward, _forwards = _loop.forward_loss, []

    def _forward_and_signal(*args, **kwargs):
        _forwards.append(1)  # one micro-batch a step: the Nth forward is step N's
        if len(_forwards) == int(os.environ["ATK_SIGNAL_AT_STEP"]):
            for name in os.environ["ATK_SIGNALS"].split(","):
                if name == "INT":
                    os.killpg(os.getpgrp(), signal.SIGINT)
                else:
                    os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
        return _forward(*args, **kwargs)
    _loop.forward_loss = _forward_and_signal

if os.environ.get("ATK_SIGNAL_AT_END"):  # this signal (TERM, INT) to the process as the end of the run begins its
    # samples and task eval, after the last step and the final adapter (tests/test_interrupts.py)
    import packtrain.trainer.run.run_end as _run_end

    _end_of_run = _run_end.end_of_run

    def _signal_then_end(*args, **kwargs):
        os.kill(os.getpid(), getattr(signal, f"SIG{os.environ['ATK_SIGNAL_AT_END']}"))
        return _end_of_run(*args, **kwargs)
    _run_end.end_of_run = _signal_then_end

if __name__ == "__main__":
    where = os.environ.get("ATK_INT_IN")  # guess or result: Ctrl-C 0.5 s into the wait
    if where:
        cls = encoder_decision.EncoderDecision
        real = getattr(cls, where)
        fired = []

        def hooked(self):
            if (self.child is not None or where == "guess") and not fired:
                fired.append(1)
                (open(os.environ["ATK_PIDFILE"], "w").write(str(self.child.pid)) if os.environ.get("ATK_PIDFILE") else None)
                threading.Timer(0.5, lambda: os.killpg(os.getpgrp(), signal.SIGINT)).start()
            return real(self)
        setattr(cls, where, hooked)
    from packtrain.cli.commands import run
    sys.argv = ["packtrain", *sys.argv[1:]]
    run()
