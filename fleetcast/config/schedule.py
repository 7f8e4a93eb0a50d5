"""EventBridge schedule expressions, checked by the grammar EventBridge documents.

Source: Amazon EventBridge User Guide, "Cron expressions reference"
(https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-cron-expressions.html; the same table in
"Using cron and rate expressions to schedule rules", eb-scheduled-rule-pattern.html) and
"Rate expressions reference" (eb-rate-expressions.html):

- cron(fields): six required fields separated by white space:
  Minutes 0-59 `, - * /`; Hours 0-23 `, - * /`; Day-of-month 1-31 `, - * ? / L W`;
  Month 1-12 or JAN-DEC `, - * /`; Day-of-week 1-7 or SUN-SAT `, - * ? L #`; Year 1970-2199 `, - * /`.
  "You can't specify the Day-of-month and Day-of-week fields in the same cron expression. If you
  specify a value or a * (asterisk) in one of the fields, you must use a ? (question mark) in the other."
  With `#`, "you can define only one expression in the day-of-week field".
  A wildcard a field's row does not list is refused: `/` in Day-of-week, and `LW` (the page documents `L`
  and `3W`, not their combination), which other cron dialects (Quartz) take.
- rate(value unit): value "a positive number"; unit minute | minutes | hour | hours | day | days;
  singular for 1, plural above.

The provider stack's events.Rule takes the expression as written (stacks/plan_drift.py): what this
refuses would otherwise fail only when CloudFormation creates the rule.
"""

from __future__ import annotations

import re

MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# The PutRule API's ScheduleExpression: "Length Constraints: Maximum length of 256" (botocore's events model).
EXPRESSION_MAX = 256
# EventBridge documents no longest rate; a drift check rarer than yearly watches nothing, and the bound
# keeps a pasted run of digits from reaching CloudFormation. Fleetcast's limit, not AWS's.
RATE_MAX = {"minute": 525_600, "hour": 8_760, "day": 365}


class _Field:
    def __init__(self, name: str, low: int, high: int, names: tuple[str, ...] = (), extra: str = ""):
        self.name, self.low, self.high, self.names, self.extra = name, low, high, names, extra

    def value(self, text: str) -> int:
        if self.names and text.upper() in self.names:
            return self.names.index(text.upper()) + self.low
        if not re.fullmatch(r"[0-9]{1,4}", text, re.ASCII):
            allowed = f"{self.low}-{self.high}" + (f" or {self.names[0]}-{self.names[-1]}" if self.names else "")
            raise ValueError(f"{self.name} {text!r} is not a value; allowed: {allowed}")
        number = int(text)
        if not self.low <= number <= self.high:
            raise ValueError(f"{self.name} {number} is out of range; allowed: {self.low}-{self.high}")
        return number

    def item(self, text: str) -> None:
        """One comma-separated part: *, a value or a range, with an /increment, L W # where the field lists them."""
        if "L" in self.extra and text.upper() == "L":
            return
        if "W" in self.extra and text.upper().endswith("W"):
            if text.upper() == "LW":
                raise ValueError(f"{self.name} 'LW' is not in EventBridge's documented grammar (L alone: the last "
                                 "day; 3W: the weekday nearest the 3rd); allowed: L, or a day followed by W")
            self.value(text[:-1])  # 3W: the weekday nearest the 3rd
            return
        if "#" in self.extra and "#" in text:
            day, _, nth = text.partition("#")
            self.value(day)
            if not re.fullmatch(r"[1-5]", nth, re.ASCII):
                raise ValueError(f"{self.name} {text!r}: the number after # is the week of the month, 1-5")
            return
        if "L" in self.extra and self.names == DAYS and text.upper().endswith("L"):
            self.value(text[:-1])  # 6L: the month's last Friday
            return
        base, slash, step = text.partition("/")
        if slash and "/" not in self.extra:
            raise ValueError(f"{self.name} {text!r}: this field takes no / increment (EventBridge lists / for every "
                             "field but Day-of-week); allowed: values, ranges, lists, * or ?, L and #")
        if slash and not (re.fullmatch(r"[0-9]{1,4}", step, re.ASCII) and int(step) >= 1):
            raise ValueError(f"{self.name} {text!r}: the increment after / is a positive whole number")
        if base == "*":
            return
        low, dash, high = base.partition("-")
        self.value(low)
        if dash:
            self.value(high)

    def check(self, text: str) -> None:
        if text == "?":
            if "?" not in self.extra:
                raise ValueError(f"{self.name} cannot be ? (only EventBridge's Day-of-month and Day-of-week take it)")
            return
        parts = text.split(",")
        if any(part == "" for part in parts):
            raise ValueError(f"{self.name} {text!r} has an empty entry between commas")
        if "#" in text and len(parts) > 1:
            raise ValueError(f"{self.name} {text!r}: with # the field holds one expression only")
        for part in parts:
            self.item(part)


# `extra`: the wildcards beyond , - * that the field's row of the documented table lists.
CRON_FIELDS = (
    _Field("Minutes", 0, 59, extra="/"),
    _Field("Hours", 0, 23, extra="/"),
    _Field("Day-of-month", 1, 31, extra="?/LW"),
    _Field("Month", 1, 12, MONTHS, extra="/"),
    _Field("Day-of-week", 1, 7, DAYS, extra="?L#"),
    _Field("Year", 1970, 2199, extra="/"),
)


def schedule_problem(expression: str) -> str | None:
    """Why EventBridge would refuse `expression`, or None."""
    if len(expression) > EXPRESSION_MAX:
        return f"{len(expression)} characters; EventBridge takes at most {EXPRESSION_MAX}"
    rate = re.fullmatch(r"rate\(([0-9]+) ([a-z]+)\)", expression, re.ASCII)
    if rate:
        number, unit = int(rate.group(1)), rate.group(2)
        singular = unit.removesuffix("s")
        if singular not in RATE_MAX:
            return f"rate unit {unit!r}; allowed: minute(s), hour(s), day(s)"
        if number < 1:
            return "a rate is a positive number of minutes, hours or days"
        if (number == 1) != (unit == singular):
            return f"rate({number} {unit}): the unit is singular for 1 and plural above (rate(1 day), rate(6 hours))"
        if number > RATE_MAX[singular]:
            return f"rate({number} {unit}) is longer than a year; allowed: at most {RATE_MAX[singular]} {singular}s"
        return None
    cron = re.fullmatch(r"cron\(([^()]*)\)", expression, re.ASCII)
    if not cron:
        return ("not a schedule expression: use rate(1 day), rate(6 hours) or cron(minutes hours day-of-month "
                "month day-of-week year), e.g. cron(0 6 * * ? *)")
    fields = re.split(r" +", cron.group(1).strip(" "))
    if len(fields) != len(CRON_FIELDS):
        return (f"cron has {len(fields)} fields; EventBridge takes six: minutes hours day-of-month month "
                "day-of-week year, e.g. cron(0 6 * * ? *)")
    problem = _fields_problem(CRON_FIELDS, fields)
    if problem:
        return problem
    if (fields[2] == "?") == (fields[4] == "?"):
        return ("one of Day-of-month and Day-of-week must be ? and the other not (EventBridge: \"If you specify a "
                "value or a * in one of the fields, you must use a ? in the other\"), e.g. cron(0 6 * * ? *)")
    return None


# EC2 Auto Scaling scheduled actions (pools[].schedule[].cron) take "Unix cron syntax format ... five fields
# separated by white spaces: [Minute] [Hour] [Day_of_Month] [Month_of_Year] [Day_of_Week]" (EC2 Auto Scaling
# API Reference, ScheduledUpdateGroupActionRequest, Recurrence), with crontab(5)'s ranges: day of week 0-7
# (0 and 7 are Sunday) or names; lists, ranges, steps and * only (no ? L W #, unlike EventBridge).
UNIX_CRON_FIELDS = (
    _Field("minute", 0, 59, extra="/"),
    _Field("hour", 0, 23, extra="/"),
    _Field("day of month", 1, 31, extra="/"),
    _Field("month", 1, 12, MONTHS, extra="/"),
    _Field("day of week", 0, 7, DAYS, extra="/"),
)


def unix_cron_problem(expression: str) -> str | None:
    """Why EC2 Auto Scaling would refuse `expression` as a scheduled action's Recurrence, or None."""
    fields = re.split(r" +", expression.strip(" "))
    if len(fields) != len(UNIX_CRON_FIELDS) or not all(fields):
        return (f"{len(fields)} fields; a scheduled action's cron has five: minute hour day-of-month month "
                "day-of-week, e.g. '0 23 * * *' (UTC)")
    return _fields_problem(UNIX_CRON_FIELDS, fields)


def _fields_problem(specs: tuple[_Field, ...], fields: list[str]) -> str | None:
    """The first field its spec refuses, in the spec's words, or None."""
    for spec, text in zip(specs, fields):
        try:
            spec.check(text)
        except ValueError as exc:
            return str(exc)
    return None
