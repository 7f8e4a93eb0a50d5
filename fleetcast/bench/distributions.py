"""Token-length and concurrency distributions parsed from short specs.

One syntax for every "how many" knob, so users learn it once:
  "128"                      fixed
  "normal:128,32"            normal(mean, std), rounded, clipped to >= 1
  "64:0.5,128-256:0.3,512:0.2"  weighted buckets; a range "A-B" is drawn uniformly
All draws come from a caller-owned `random.Random`, so a seed reproduces a run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fleetcast.contract.errors import UserError


@dataclass(frozen=True)
class Bucket:
    lo: int
    hi: int
    weight: float


@dataclass(frozen=True)
class IntDistribution:
    """A distribution over positive integers; `spec` is the text it came from."""

    spec: str
    kind: str  # "fixed" | "normal" | "buckets"
    value: int = 0
    mean: float = 0.0
    std: float = 0.0
    buckets: tuple[Bucket, ...] = ()
    minimum: int = 1

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.value
        if self.kind == "normal":
            return max(self.minimum, int(round(rng.gauss(self.mean, self.std))))
        bucket = rng.choices(self.buckets, weights=[b.weight for b in self.buckets])[0]
        return bucket.lo if bucket.lo == bucket.hi else rng.randint(bucket.lo, bucket.hi)

    def expected(self) -> float:
        if self.kind == "fixed":
            return float(self.value)
        if self.kind == "normal":
            return self.mean
        total = sum(b.weight for b in self.buckets)
        return sum((b.lo + b.hi) / 2 * b.weight for b in self.buckets) / total

    def max_value(self) -> int:
        if self.kind == "fixed":
            return self.value
        if self.kind == "normal":
            return int(self.mean + 4 * self.std)
        return max(b.hi for b in self.buckets)


def _int(text: str, what: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"{what}: {text!r} in {spec!r} is not an integer") from None
    if value < 1:
        raise UserError(f"{what}: {value} in {spec!r} must be >= 1")
    return value


def parse_distribution(spec: str, what: str) -> IntDistribution:
    """Parse a spec (see module doc); `what` names the CLI argument in errors."""
    text = str(spec).strip()
    hint = "use N, normal:MEAN,STD or weighted buckets like 64:0.5,128-256:0.5"
    if not text:
        raise UserError(f"{what}: empty; {hint}")
    if text.startswith("normal:"):
        parts = text[len("normal:"):].split(",")
        if len(parts) != 2:
            raise UserError(f"{what}: {text!r} must be normal:MEAN,STD")
        try:
            mean, std = float(parts[0]), float(parts[1])
        except ValueError:
            raise UserError(f"{what}: {text!r} must be normal:MEAN,STD with numbers") from None
        if mean < 1 or std < 0:
            raise UserError(f"{what}: {text!r} needs MEAN >= 1 and STD >= 0")
        return IntDistribution(spec=text, kind="normal", mean=mean, std=std)
    if ":" not in text and "," not in text and "-" not in text:
        return IntDistribution(spec=text, kind="fixed", value=_int(text, what, text))
    buckets = []
    for part in text.split(","):
        if ":" not in part:
            raise UserError(f"{what}: bucket {part!r} in {text!r} has no weight; {hint}")
        size, _, weight_text = part.partition(":")
        try:
            weight = float(weight_text)
        except ValueError:
            raise UserError(f"{what}: weight {weight_text!r} in {text!r} is not a number") from None
        if weight < 0:
            raise UserError(f"{what}: weight {weight} in {text!r} is negative")
        if "-" in size:
            lo_t, _, hi_t = size.partition("-")
            lo, hi = _int(lo_t.strip(), what, text), _int(hi_t.strip(), what, text)
            if hi < lo:
                raise UserError(f"{what}: range {size!r} in {text!r} is reversed")
        else:
            lo = hi = _int(size.strip(), what, text)
        buckets.append(Bucket(lo, hi, weight))
    if sum(b.weight for b in buckets) <= 0:
        raise UserError(f"{what}: weights in {text!r} sum to zero")
    return IntDistribution(spec=text, kind="buckets", buckets=tuple(buckets))


def parse_int_list(spec: str, what: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]; every value >= 1."""
    values = [_int(p.strip(), what, spec) for p in str(spec).split(",") if p.strip()]
    if not values:
        raise UserError(f"{what}: give at least one value, e.g. 1,2,4,8")
    return values
