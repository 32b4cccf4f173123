"""Value domains: the types config signatures declare (checked while jsonargparse parses) and
:func:`positive` for the sub-commands' argparse numbers."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from jsonargparse.typing import restricted_number_type

from fixed_embed.errors import UserError


def domain(name: str, kind: type, *restrictions: tuple[str, float]) -> type:
    """A domain that jsonargparse checks while parsing (NaN fails every comparison), for config
    signatures."""
    # restrictions other than jsonargparse's own; a value is its plain kind: weights_only-safe
    typed = restricted_number_type(name, kind, list(restrictions))
    typed.__new__ = staticmethod(lambda cls, v: cls._validation_fn(cls, v) or kind(v))
    return typed


PositiveInt = domain("an integer >= 1", int, (">=", 1))
NonNegativeInt = domain("an integer >= 0", int, (">", -1))
PerMille = domain("an integer in [0, 1000]", int, (">=", 0), ("<=", 1000))
Beta = domain("in [0, 1)", float, (">=", 0.0), ("<", 1.0))
PositiveFinite = domain("a finite number > 0", float, (">", 0.0), ("<", math.inf))
NonNegativeFinite = domain("a finite number >= 0", float, (">=", 0.0), ("<", math.inf))
# "< inf": not jsonargparse's ClosedUnitInterval
UnitInterval = domain("in [0, 1]", float, (">=", 0.0), ("<=", 1.0), ("<", math.inf))


def positive(flag: str, kind: type = int, zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite ``kind`` > 0 (>= 0 if ``zero``), else a UserError naming
    ``flag`` in one line."""

    def parse(text: str) -> float:
        # refused below: a UserError passes argparse, which prints no usage
        with contextlib.suppress(ValueError):
            if math.isfinite(value := kind(text)) and (value > 0 or (zero and value == 0)):
                return value
        raise UserError(
            f"{flag} must be a finite {kind.__name__} {'>=' if zero else '>'} 0, got {text!r}"
        )

    return parse
