"""The traffic profile, `fleetcast.traffic/v1`: what production asks of the fleet.

One entry per consumer region (per consumer region and model in a fleet of several
models: `model` names which): the request rate (arrivals) for each UTC hour of
the day, how bursty arrivals are within the hour, and the input/output length
distributions. With `burstiness` (or without `concurrency`) the planner derives
the per-instance concurrency each candidate's instances would see from the
arrivals and its curve; a profile with only a `concurrency` histogram (the
per-instance batch levels an existing fleet served at) is weighed level by level
as before. See docs/plan.md.

    schema: fleetcast.traffic/v1
    name: seoul-voice
    consumers:
      - region: ap-northeast-2
        rate_rps: {"0-9": 60, "9-13": 90, "13-22": 10, "22-24": 40}   # or 24 numbers
        burstiness: 1.3                                                 # busiest minute / hour mean
        concurrency: {"1-16": 0.80, "32": 0.15, "64": 0.05}            # optional: observed batch shares
        input_tokens: 256                                               # a mean, or {tokens: share}
        output_tokens: 128
        model: gpt2-xl                                                  # several models: one entry per model
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from fleetcast.contract.errors import UserError

SCHEMA_ID = "fleetcast.traffic/v1"
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
_SHARE_TOLERANCE = 1e-3


# A profile's keys are read again at every hourly_rps() (the planner asks thousands of times per plan); typed, so
# that a key True or 1.0 is parsed (and refused) as itself, never answered from the key 1.
@functools.lru_cache(maxsize=4096, typed=True)
def _parse_range(key: object, upper: int, lower: int = 1) -> tuple[int, int]:
    match = _RANGE.match(str(key))
    if not match:
        raise ValueError(f"{key!r} is not a level or range such as 32 or 1-16")
    lo = int(match.group(1))
    hi = int(match.group(2)) if match.group(2) else lo
    if not (lower <= lo <= hi <= upper):
        raise ValueError(f"{key!r}: must satisfy {lower} <= low <= high <= {upper}")
    return lo, hi


def _check_shares(shares: dict[str, float], what: str) -> None:
    total = sum(shares.values())
    if any(v < 0 for v in shares.values()):
        raise ValueError(f"{what} shares must be >= 0")
    if abs(total - 1.0) > _SHARE_TOLERANCE:
        raise ValueError(f"{what} shares must sum to 1, got {total:.4f}")


class ObservedTraffic(BaseModel):
    """What the gateways metered, as `fleetcast traffic export` read it from CloudWatch (docs/plan.md).

    Counts, not shares, so profiles of adjacent windows add up and a reader can tell 3 requests
    from 3,000. Hourly series start at `since` (an hour boundary, UTC) and have one entry per hour.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    since: str = Field(description="Start of the window (ISO 8601, UTC, on the hour).")
    until: str = Field(description="End of the window (ISO 8601, UTC, on the hour).")
    arrivals: list[int] = Field(description="Requests arriving per hour (throttled ones included), from `since`.")
    throttled: list[int] = Field(description="Of those, refused with 429 by the consumer limits, per hour.")
    peak_minute_ratio: list[float] = Field(
        description="Per hour: the busiest minute's arrivals x 60 over the hour's arrivals (1 = steady; 1 where none).")
    dispersion_60s: list[float] = Field(
        description="Per hour: variance over mean of the 60 per-minute arrival counts (1 = Poisson, > 1 bursty; "
        "0 where none).")
    in_flight: dict[str, int] = Field(
        description="Requests by the in-flight count on their instance at arrival (itself included), by bucket.")
    input_tokens: dict[str, int] = Field(description="Served requests by prompt tokens, by bucket ('129-256').")
    output_tokens: dict[str, int] = Field(description="Served requests by completion tokens, by bucket.")
    consumers: dict[str, int] = Field(description="Requests per consumer (config name) over the window.")
    ttft_p99_ms: list[float | None] | None = Field(
        default=None, description="Per hour: the pool's P99 TTFT at the gateway (CloudWatch p99), null without data.")
    itl_p99_ms: list[float | None] | None = Field(
        default=None, description="Per hour: the pool's P99 inter-token latency, null without data.")
    models: dict[str, int] | None = Field(
        default=None, description="Requests per model from this consumer region over the window, every model's (the "
        "same in each of the region's entries), so one model's share of the region reads off; null: a one-model "
        "profile.")
    served_in: dict[str, int] | None = Field(
        default=None, description="Requests per provider region that served them, when some were served outside "
        "their home region (cross-region spill, docs/gateway.md): origin is this entry, serving is each key; null: "
        "every request was served at home.")

    @field_validator("in_flight", "input_tokens", "output_tokens", mode="before")
    @classmethod
    def _string_keys(cls, value: Any) -> Any:
        return {str(k): v for k, v in value.items()} if isinstance(value, dict) else value

    @field_validator("in_flight", "input_tokens", "output_tokens")
    @classmethod
    def _buckets(cls, value: Any) -> Any:
        for key, count in value.items():
            _parse_range(key, 1 << 20)
            if count < 0:
                raise ValueError(f"{key!r}: a count must be >= 0")
        return value

    @model_validator(mode="after")
    def _same_length(self) -> ObservedTraffic:
        n = len(self.arrivals)
        for name in ("throttled", "peak_minute_ratio", "dispersion_60s", "ttft_p99_ms", "itl_p99_ms"):
            series = getattr(self, name)
            if series is not None and len(series) != n:
                raise ValueError(f"{name} has {len(series)} hourly values, arrivals has {n}; one per hour each")
        return self

    def shares(self, what: str) -> dict[str, float]:
        """A bucket histogram (`in_flight`, `input_tokens`, `output_tokens`) or `consumers` as shares."""
        counts = {k: v for k, v in getattr(self, what).items() if v > 0}
        total = sum(counts.values())
        return {k: v / total for k, v in counts.items()} if total else {}


class ConsumerTraffic(BaseModel):
    """Traffic from one consumer region (to one model of the fleet when `model` is set)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$", description="Consumer region, e.g. ap-northeast-2.")
    model: str | None = Field(
        default=None, min_length=1,
        description="The fleet model (models[].id of the config) this entry's arrivals and lengths are for: one entry "
        "per (region, model). Absent: the config's only model; a fleet of several models needs it on every entry.",
    )
    rate_rps: list[float] | dict[str, float] = Field(
        description="Requests per second for each UTC hour: 24 numbers, or {'start-end': rps} half-open "
        "hour ranges covering 0-24 exactly."
    )
    burstiness: float | list[float] | None = Field(
        default=None,
        description="Within-hour burstiness of arrivals: the busiest 1-minute arrival rate of the hour divided by "
        "the hour's mean rate (>= 1; 1 = steady); one number for every hour or 24 (UTC 0..23). Given (or when "
        "`concurrency` is absent), the planner sizes each hour for its busiest minute and derives per-instance "
        "concurrency from arrivals (docs/plan.md).",
    )
    concurrency: dict[str, float] | None = Field(
        default=None,
        description="Optional: share of requests served at each per-instance concurrency (batch) level an existing "
        "fleet saw: keys are a level ('32') or an inclusive range ('1-16', spread evenly over its integer levels); "
        "shares sum to 1. Used as given only when `burstiness` is absent.",
    )
    input_tokens: float | dict[str, float] = Field(description="Mean prompt tokens, or {tokens: share}.")
    output_tokens: float | dict[str, float] = Field(description="Mean completion tokens, or {tokens: share}.")
    observed: ObservedTraffic | None = Field(
        default=None, description="What production metered (written by `fleetcast traffic export`): hourly arrivals, "
        "burstiness, length and in-flight histograms, per-consumer counts, observed P99s.")

    @field_validator("concurrency", "input_tokens", "output_tokens", "rate_rps", mode="before")
    @classmethod
    def _string_keys(cls, value: Any) -> Any:
        # YAML turns `32: 0.15` into an int key; keys are kept as strings.
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
        return value

    @field_validator("rate_rps")
    @classmethod
    def _rates(cls, value: Any) -> Any:
        if isinstance(value, list):
            if len(value) != 24:
                raise ValueError(f"give 24 hourly values (UTC 0..23), got {len(value)}")
            if any(v < 0 for v in value):
                raise ValueError("rates must be >= 0")
            return value
        covered = [0] * 24
        for key, rps in value.items():
            lo, hi = _parse_range(key, 24, lower=0)
            if lo == hi:
                raise ValueError(f"{key!r}: hour ranges are half-open 'start-end' with start < end, e.g. '0-9'")
            if rps < 0:
                raise ValueError(f"{key!r}: rate must be >= 0")
            for hour in range(lo, hi):
                covered[hour] += 1
        for hour, n in enumerate(covered):
            if n != 1:
                raise ValueError(f"UTC hour {hour} is covered {n} times; the ranges must cover 0-24 exactly once")
        return value

    @field_validator("burstiness")
    @classmethod
    def _burstiness(cls, value: Any) -> Any:
        if value is None:
            return value
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(value) != 24:
            raise ValueError(f"give one number or 24 hourly values (UTC 0..23), got {len(value)}")
        if any(not (1.0 <= v <= 60.0) for v in values):
            raise ValueError("burstiness is the busiest minute's rate over the hour's mean: 1 <= value <= 60")
        return value

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, value: Any) -> Any:
        if value is not None:
            if not value:
                raise ValueError("give at least one level")
            for key in value:
                _parse_range(key, 4096)
            _check_shares(value, "concurrency")
        return value

    @field_validator("input_tokens", "output_tokens")
    @classmethod
    def _lengths(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for key in value:
                if not str(key).isdigit() or int(key) <= 0:
                    raise ValueError(f"{key!r} is not a positive token count")
            _check_shares(value, "length")
        elif value <= 0:
            raise ValueError("must be > 0")
        return value

    # -- derived views --

    def hourly_rps(self) -> list[float]:
        if isinstance(self.rate_rps, list):
            return [float(v) for v in self.rate_rps]
        hours = [0.0] * 24
        for key, rps in self.rate_rps.items():
            lo, hi = _parse_range(key, 24, lower=0)
            for hour in range(lo, hi):
                hours[hour] = float(rps)
        return hours

    @property
    def arrival_driven(self) -> bool:
        """Size from arrivals (per-instance concurrency derived per candidate) rather than a given histogram."""
        return self.burstiness is not None or self.concurrency is None

    def hourly_burstiness(self) -> list[float]:
        """Busiest-minute rate over the hour's mean, per UTC hour (1.0 where not given)."""
        if self.burstiness is None:
            return [1.0] * 24
        if isinstance(self.burstiness, list):
            return [float(v) for v in self.burstiness]
        return [float(self.burstiness)] * 24

    def level_weights(self) -> dict[int, float]:
        """Share of requests per integer concurrency level (ranges spread evenly)."""
        if self.concurrency is None:
            raise ValueError(f"traffic for {self.region} has no concurrency histogram")
        out: dict[int, float] = {}
        for key, share in self.concurrency.items():
            lo, hi = _parse_range(key, 4096)
            for level in range(lo, hi + 1):
                out[level] = out.get(level, 0.0) + share / (hi - lo + 1)
        return dict(sorted(out.items()))

    @staticmethod
    def _mean(value: float | dict[str, float]) -> float:
        if isinstance(value, dict):
            return sum(int(k) * v for k, v in value.items())
        return float(value)

    @property
    def input_mean(self) -> float:
        return self._mean(self.input_tokens)

    @property
    def output_mean(self) -> float:
        return self._mean(self.output_tokens)

    def scaled(self, factor: float) -> ConsumerTraffic:
        # The observation stays what it was: it is history, the scaled rates are a what-if.
        return self.model_copy(update={"rate_rps": [v * factor for v in self.hourly_rps()]})


class TrafficProfile(BaseModel):
    """Production traffic per consumer region."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_id: Literal["fleetcast.traffic/v1"] = Field(alias="schema", description="Always fleetcast.traffic/v1.")
    name: str = Field(min_length=1, max_length=64, description="Profile name shown in reports.")
    description: str | None = None
    consumers: list[ConsumerTraffic] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_regions(self) -> TrafficProfile:
        keys = [(c.region, c.model) for c in self.consumers]
        dup = sorted({k for k in keys if keys.count(k) > 1}, key=str)
        if dup:
            named = ", ".join(r if m is None else f"{r} (model {m})" for r, m in dup)
            raise ValueError(f"consumer region(s) listed twice: {named}; one entry per region and model")
        models = {c.model for c in self.consumers}
        if None in models and len(models) > 1:
            bare = sorted({c.region for c in self.consumers if c.model is None})
            raise ValueError(f"consumers[].model is set on some entries but not on those of {', '.join(bare)}: in a "
                             f"profile of several models every entry names its model (one of "
                             f"{', '.join(sorted(m for m in models if m))})")
        return self

    @property
    def models(self) -> tuple[str, ...]:
        """The models the entries name, in first-seen order (empty: a one-model profile without `model`)."""
        return tuple(dict.fromkeys(c.model for c in self.consumers if c.model is not None))

    def for_model(self, model_id: str) -> TrafficProfile:
        """The entries of one model (a profile without `model` is all the only model's)."""
        if not self.models:
            return self
        return self.model_copy(update={"consumers": [c for c in self.consumers if c.model == model_id]})

    def checked_against(self, model_ids: tuple[str, ...], flag: str = "--traffic") -> TrafficProfile:
        """This profile's entries resolved against the config's models: every `model` one of them, and with
        several models every entry names one (the error names the field and lists the models)."""
        allowed = ", ".join(model_ids)
        for i, c in enumerate(self.consumers):
            if c.model is None and len(model_ids) > 1:
                raise UserError(f"{flag}: consumers[{i}].model is missing (region {c.region}): the config serves "
                                f"{len(model_ids)} models; allowed: {allowed}")
            if c.model is not None and c.model not in model_ids:
                raise UserError(f"{flag}: consumers[{i}].model {c.model!r} is not a model of the config; "
                                f"allowed: {allowed}")
        if len(model_ids) == 1 and any(c.model is None for c in self.consumers):
            # A one-model fleet is a packing of one: its entries name that model.
            return self.model_copy(update={"consumers": [c if c.model else c.model_copy(update={"model": model_ids[0]})
                                                         for c in self.consumers]})
        return self

    def scaled(self, factor: float) -> TrafficProfile:
        return self.model_copy(update={"consumers": [c.scaled(factor) for c in self.consumers]})


def load_traffic(path: str | Path) -> TrafficProfile:
    """Read and validate a traffic profile; problems raise UserError naming the field."""
    p = Path(path)
    try:
        data = YAML(typ="safe").load(p.read_text())
    except FileNotFoundError:
        raise UserError(f"--traffic: {p} does not exist") from None
    except YAMLError as exc:
        raise UserError(f"--traffic: {p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"--traffic: {p} must be a mapping with schema: {SCHEMA_ID}")
    if data.get("schema") != SCHEMA_ID:
        raise UserError(f"--traffic: {p}: schema is {data.get('schema')!r}, expected {SCHEMA_ID!r}")
    try:
        return TrafficProfile.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"--traffic: {p}: {validation_summary(exc)}") from None


def validation_summary(exc: ValidationError) -> str:
    """One line per problem: dotted field path and pydantic's message."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in err["loc"] if not (isinstance(x, str) and ("[" in x or x in ("list", "dict", "float"))))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (typo?)"
        parts.append(f"{loc or '(top level)'}: {msg}")
    # Unions (list | dict) report each branch; keep distinct lines.
    return "; ".join(dict.fromkeys(parts))
