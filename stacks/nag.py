"""cdk-nag (3.x) registration and acknowledgments.

cdk-nag 3 runs as a CDK policy-validation plugin: findings fail synthesis and
land in the cloud assembly's validation report, not in Annotations. Findings
are acknowledged one by one (granular ids such as
`AwsSolutions-IAM5[Resource::*]`), each with the reason it is acceptable.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Stack, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

REPORT_FILE = "validation-report.json"

# Every acknowledgment made, as (construct path, rule id). A test turns
# `APPLY_ACKNOWLEDGMENTS` off, synthesizes, and checks that the findings are
# exactly the recorded acknowledgments: none missing, none stale.
RECORDED: list[tuple[str, str]] = []
APPLY_ACKNOWLEDGMENTS = True


def enable(app: App) -> None:
    """Run the AwsSolutions pack on every stack of the app at synthesis."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge one finding (or one granular finding) on `scope` and its children."""
    if len(reason.strip()) < 20:
        raise ValueError(f"acknowledgment of {rule} needs a real reason, got {reason!r}")
    RECORDED.append((scope.node.path, rule))
    if APPLY_ACKNOWLEDGMENTS:
        Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))


def arn_ref(scope: IConstruct, attribute: str = "Arn") -> str:
    """How cdk-nag names a `Fn::GetAtt` of `scope`'s resource inside a granular finding id."""
    child = scope.node.default_child if scope.node.default_child is not None else scope
    stack = Stack.of(scope)
    logical_id = stack.resolve(stack.get_logical_id(child))
    return f"<{logical_id}.{attribute}>"


def acknowledge_warning(scope: IConstruct, annotation_id: str, reason: str) -> None:
    """Acknowledge a CDK construct warning (an Annotation, not a cdk-nag finding) on `scope`."""
    if len(reason.strip()) < 20:
        raise ValueError(f"acknowledgment of {annotation_id} needs a real reason, got {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=f"Annotation::{annotation_id}", reason=reason))
