"""EventBridge schedule expressions (operations.plan_drift_check.schedule), by EventBridge's documented grammar.

Source: Amazon EventBridge User Guide, "Setting a schedule pattern for scheduled rules"
(https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-scheduled-rule-pattern.html): six cron fields
with their ranges and wildcards, and "You can't specify the Day-of-month and Day-of-week fields in the same
cron expression"; "Rate expressions reference" (eb-rate-expressions.html): a positive value, singular unit for
1. The PutRule ScheduleExpression and the Lambda Description limits (256 each) are read from botocore's models.
Each refused expression below passed the old field count and failed only when the provider stack deployed.
"""

from __future__ import annotations

import copy

import botocore.loaders
import pytest

from fleetcast.config.rules import LAMBDA_DESCRIPTION_MAX
from fleetcast.config.schedule import EXPRESSION_MAX, schedule_problem, unix_cron_problem

from .conftest import problems


@pytest.mark.parametrize("expression", [
    "rate(1 minute)", "rate(5 minutes)", "rate(1 hour)", "rate(6 hours)", "rate(1 day)", "rate(365 days)",
    "cron(0 6 * * ? *)", "cron(15 10 ? * 6L 2019-2022)", "cron(0/15 * ? * MON-FRI *)", "cron(0 10 L * ? *)",
    "cron(0 10 ? * 3#2 *)", "cron(0 10 3W * ? *)", "cron(0 8 1 JAN-MAR ? *)", "cron(5,35 14 * * ? *)",
    "cron(0 18 ? * MON-FRI *)", "cron(0 0 ? * SUN *)",
])
def test_documented_expressions_are_accepted(expression):
    # The EventBridge page's own examples among them: cron(15 10 ? * 6L 2019-2022), cron(0/15 * ? * MON-FRI *).
    assert schedule_problem(expression) is None


@pytest.mark.parametrize("expression,expected", [
    ("cron(0 25 * * ? *)", "Hours 25 is out of range"),
    ("cron(60 6 * * ? *)", "Minutes 60 is out of range"),
    ("cron(0 6 * * * *)", "one of Day-of-month and Day-of-week must be ?"),
    ("cron(0 6 ? * ? *)", "one of Day-of-month and Day-of-week must be ?"),
    ("cron(0 6 * * ? * *)", "cron has 7 fields"),
    ("cron(0 6 * * ?)", "cron has 5 fields"),
    ("cron(0 \u0666 * * ? *)", "Hours '\u0666' is not a value"),
    ("cron(0 6 32 * ? *)", "Day-of-month 32 is out of range"),
    ("cron(0 6 ? 13 MON *)", "Month 13 is out of range"),
    ("cron(0 6 ? * 8 *)", "Day-of-week 8 is out of range"),
    ("cron(0 6 ? * 3#6 *)", "week of the month"),
    ("cron(0 6 ? * 3#1,6#3 *)", "with # the field holds one expression"),
    ("cron(0 6 * * ? 1969)", "Year 1969 is out of range"),
    ("cron(0/0 6 * * ? *)", "increment after / is a positive"),
    ("cron(0 ? * * ? *)", "Hours cannot be ?"),
    # Not in the documented grammar (see test_wildcards_the_table_does_not_list_are_refused).
    ("cron(0 6 ? * 1/2 *)", "Day-of-week '1/2': this field takes no / increment"),
    ("cron(0 6 ? * */2 *)", "Day-of-week '*/2': this field takes no / increment"),
    ("cron(0 6 LW * ? *)", "Day-of-month 'LW' is not in EventBridge's documented grammar"),
    ("rate(99999999999 days)", "longer than a year"),
    ("rate(\u0665 minutes)", "not a schedule expression"),
    ("rate(1 hours)", "singular for 1"),
    ("rate(5 hour)", "singular for 1"),
    ("rate(0 days)", "positive"),
    ("rate(2 weeks)", "rate unit 'weeks'"),
    ("daily", "not a schedule expression"),
    ("cron(0 6 * * ? *)\n", "not a schedule expression"),
])
def test_expressions_eventbridge_refuses_are_refused_with_the_reason(expression, expected):
    problem = schedule_problem(expression)
    assert problem is not None and expected in problem, problem


def test_wildcards_the_table_does_not_list_are_refused():
    # Amazon EventBridge User Guide, "Cron expressions reference"
    # (https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-cron-expressions.html), the Wildcards column:
    # Day-of-month ", - * ? / L W", Day-of-week ", - * ? L #" (no /), the other fields ", - * /". L and W are
    # described apart ("L ... specifies the last day of the month or week", "3W specifies the weekday closest
    # to the third day"); LW, which Quartz-style cron takes, is not listed.
    assert schedule_problem("cron(0 6 1/5 * ? *)") is None  # / where the table lists it
    assert schedule_problem("cron(0 6 ? * 2/2 *)") is not None
    assert schedule_problem("cron(0 6 LW * ? *)") is not None
    assert schedule_problem("cron(0 6 L * ? *)") is None and schedule_problem("cron(0 6 15W * ? *)") is None


def test_the_length_limits_are_the_api_models():
    loader = botocore.loaders.create_loader()
    assert loader.load_service_model("events", "service-2")["shapes"]["ScheduleExpression"]["max"] == EXPRESSION_MAX
    assert loader.load_service_model("lambda", "service-2")["shapes"]["Description"]["max"] == LAMBDA_DESCRIPTION_MAX


def test_a_schedule_that_overflows_the_lambda_description_is_refused_at_validate(doc):
    # Valid by the grammar, 250 characters: the drift Lambda's description quotes it and would pass 256.
    minutes = ",".join(str(m) for m in range(0, 60))
    hours = ",".join(str(h) for h in range(0, 24))
    schedule = f"cron({minutes} {hours} ? * MON-FRI *)"
    assert schedule_problem(schedule) is None and len(schedule) <= EXPRESSION_MAX
    doc["operations"]["plan_drift_check"] = {"schedule": schedule}
    [problem] = problems(doc)
    assert problem.startswith("operations.plan_drift_check.schedule:") and "Lambda takes at most 256" in problem
    fits = copy.deepcopy(doc)
    fits["operations"]["plan_drift_check"] = {"schedule": "cron(0,30 6 ? * MON-FRI *)"}
    assert problems(fits) == []


def test_a_refused_schedule_names_the_field(doc):
    doc["operations"]["plan_drift_check"] = {"schedule": "cron(0 25 * * ? *)"}
    [problem] = problems(doc)
    assert problem.startswith("operations.plan_drift_check.schedule:") and "Hours 25" in problem


# ---------------------------------------------------------------- pools[].schedule[].cron: EC2 Auto Scaling
# "Unix cron syntax format ... five fields separated by white spaces: [Minute] [Hour] [Day_of_Month]
# [Month_of_Year] [Day_of_Week]" (EC2 Auto Scaling API Reference, ScheduledUpdateGroupActionRequest,
# Recurrence; its example "30 0 1 1,6,12 *"), with crontab(5)'s ranges.


@pytest.mark.parametrize("expression", ["30 0 1 1,6,12 *", "0 23 * * *", "*/15 8-18 * * MON-FRI", "0 0 * * 0",
                                        "0 0 * * 7", "0 6 1-7 JAN *"])
def test_scheduled_action_crons_auto_scaling_takes_are_accepted(expression):
    assert unix_cron_problem(expression) is None


@pytest.mark.parametrize("expression,expected", [
    ("0 25 * * *", "hour 25 is out of range"),
    ("60 6 * * *", "minute 60 is out of range"),
    ("0 6 * *", "4 fields"),
    ("0 6 * * * *", "6 fields"),
    ("0 6 * * 8", "day of week 8 is out of range"),
    ("0 \u0666 * * *", "hour '\u0666' is not a value"),
    ("0 6 ? * MON", "day of month cannot be ?"),
    ("0 6 L * *", "day of month 'L' is not a value"),
])
def test_scheduled_action_crons_auto_scaling_refuses_are_refused(expression, expected):
    problem = unix_cron_problem(expression)
    assert problem is not None and expected in problem, problem


def test_a_pool_schedule_with_hour_25_is_refused_naming_the_step(doc):
    doc["regions"][0]["pools"][0]["schedule"] = [{"cron": "0 25 * * *", "min": 1, "max": 2}]
    [problem] = problems(doc)
    assert problem.startswith("regions[0].pools[0].schedule[0].cron:") and "hour 25" in problem
