"""Answer checkers for the verifier tests, run in the verifier's worker (a module without torch: quick to import)."""
import time


def spin(pred: str, gold: str) -> bool:
    """Computes for ``pred`` seconds of CPU time, then says the answer is right."""
    end = time.process_time() + float(pred)
    while time.process_time() < end:
        pass
    return True


def hang(pred: str, gold: str) -> bool:
    """Blocks without computing: only the wall-clock limit can end it."""
    time.sleep(600)
    return True
