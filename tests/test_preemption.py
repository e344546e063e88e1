"""Tests for jia_jax.preemption: a stop signal sets the request once, then acts as before."""

import os
import signal
import time

from jia_jax import preemption


def wait_for(predicate):
    # The Python-level handler runs at the main thread's next check for pending signals.
    for _ in range(1000):
        if predicate():
            return True
        time.sleep(0.001)
    return False


def test_sigterm_requests_stop_then_restores_previous_handler():
    previous_term = signal.getsignal(signal.SIGTERM)
    previous_int = signal.getsignal(signal.SIGINT)
    with preemption.PreemptionHandler() as handler:
        assert not handler.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for(lambda: handler.requested)
        # A second SIGTERM would go to the handler installed before.
        assert signal.getsignal(signal.SIGTERM) is previous_term
        assert signal.getsignal(signal.SIGINT) is not previous_int
    assert signal.getsignal(signal.SIGINT) is previous_int
