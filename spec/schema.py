"""Config schemas: what each setting accepts (type, range, finiteness, allowed values), checked in one place with a
one-line error that names the setting. Used by the simulator's and the trainer's configs."""
from __future__ import annotations

import math
from dataclasses import dataclass

_KINDS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a non-empty string",
          dict: "a mapping"}


@dataclass(frozen=True)
class Rule:
    """One setting: ``type`` (bool, int, float, str or dict), bounds ``ge``/``gt``/``le``/``lt`` for numbers (which
    are always finite), ``choices`` (allowed values), ``optional`` (None allowed)."""

    type: type
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple = ()
    optional: bool = False

    def expected(self) -> str:
        """What the setting accepts, in words."""
        if self.choices:
            text = "one of " + ", ".join(map(str, self.choices))
        else:
            text = _KINDS[self.type]
            lo = f"[{self.ge}" if self.ge is not None else f"({self.gt}" if self.gt is not None else None
            hi = f"{self.le}]" if self.le is not None else f"{self.lt})" if self.lt is not None else None
            if lo and hi:
                text += f" in {lo}, {hi}"
            elif lo:
                text += f" {'>=' if lo[0] == '[' else '>'} {lo[1:]}"
            elif hi:
                text += f" {'<=' if hi[-1] == ']' else '<'} {hi[:-1]}"
        return text + (" (or null)" if self.optional else "")

    def check(self, name: str, value):
        """``value`` if the setting accepts it (ints widened to float for float settings, numeric strings such as
        YAML 1.1's '1e-5' read as floats); else ValueError naming ``name``."""
        if value is None and self.optional:
            return None
        typed = self._typed(value)
        if typed is None or not self._in_range(typed):
            hint = did_you_mean(value, self.choices) if self.choices and isinstance(value, str) else ""
            raise ValueError(f"{name}: expected {self.expected()}, got {show(value)}{hint}")
        return typed

    def _typed(self, value):
        """``value`` as this setting's type, or None if it is not one."""
        if self.type is float:
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    return None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return None
            try:
                value = float(value)
            except OverflowError:  # an int beyond float's range
                return None
            return value if math.isfinite(value) else None
        if self.type is int and isinstance(value, bool):
            return None
        if not isinstance(value, self.type) or (self.type is str and not value.strip()):
            return None
        return value

    def _in_range(self, v) -> bool:
        if self.choices:
            return v in self.choices
        if self.type not in (int, float):
            return True
        return ((self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt)
                and (self.le is None or v <= self.le) and (self.lt is None or v < self.lt))


def show(value, limit: int = 80) -> str:
    """``repr`` of a value, cut to one short line (a hostile value may be huge or span lines): how error messages
    quote a value."""
    return cut(repr(value), limit)


def cut(text: str, limit: int = 1000) -> str:
    """``text`` cut to at most ``limit`` characters (by default a long but readable line: the CLI's errors and
    warnings), the cut marked with the length of the whole."""
    if len(text) <= limit:
        return text
    note = f"... (cut from {len(text)} characters)"
    return text[:max(limit - len(note), 0)] + note


def did_you_mean(name, choices) -> str:
    """``" (did you mean 'x'?)"`` naming the choice closest to a misspelt ``name`` by difflib's similarity ratio (at
    least 0.6; those equally close, up to three, when several are), or "" when none is close: said right after the
    ``name`` an error refuses."""
    from difflib import SequenceMatcher, get_close_matches
    choices = [str(c) for c in choices]
    close = get_close_matches(str(name), choices, n=max(len(choices), 1))
    if not close:
        return ""
    best = SequenceMatcher(None, close[0], str(name)).ratio()
    tied = [repr(c) for c in sorted(c for c in close if SequenceMatcher(None, c, str(name)).ratio() == best)[:3]]
    return f" (did you mean {' or '.join([', '.join(tied[:-1]), tied[-1]] if len(tied) > 1 else tied)}?)"
