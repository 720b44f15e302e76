"""The answer-checking worker behind ``gpu.rewards.Verifier``: a long-lived process, started as a script (so it never
imports torch), that reads one JSON request per line on stdin and writes one JSON reply per line on stdout.

First line in: ``{"ppid": pid, "path": sys.path, "checker": "module:function" or null, "warmup": [pred, gold] or
null}``; the worker pays its imports and the checker's first-call cost on the warm-up pair, then replies
``{"ready": true}``. Then each
``[pred, gold]`` gets ``{"ok": bool}``. Answers are parsed by the checker, never executed. The parent enforces the
time limit by killing this process; it also dies with the parent (end of stdin, or PR_SET_PDEATHSIG on Linux)."""
import importlib
import json
import logging
import os
import signal
import sys


def math_verify_check(pred: str, gold: str) -> bool:
    """math-verify's symbolic equivalence of ``pred`` (as if boxed) to ``gold`` (its own timeouts off)."""
    from math_verify import parse, verify
    return bool(verify(parse(f"${gold}$", parsing_timeout=None), parse(f"$\\boxed{{{pred}}}$", parsing_timeout=None),
                       timeout_seconds=None))


def _die_with_parent(ppid: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != ppid:  # the parent died before prctl took effect
        os._exit(0)


def _checker(spec: str | None):
    if not spec:
        return math_verify_check
    module, _, name = spec.partition(":")
    fn = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the replies
    hello = json.loads(sys.stdin.readline())
    _die_with_parent(hello["ppid"])
    sys.path[:] = hello["path"]
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" warning: the parent times us
    check = _checker(hello["checker"])
    if hello["warmup"]:
        check(*hello["warmup"])
    replies.write('{"ready": true}\n')
    for line in sys.stdin:
        pred, gold = json.loads(line)
        try:
            ok = bool(check(pred, gold))
        except Exception:  # an answer the checker cannot parse is not a correct one
            ok = False
        replies.write(json.dumps({"ok": ok}) + "\n")


if __name__ == "__main__":
    main()
