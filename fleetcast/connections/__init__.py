"""Review, approve and reject PrivateLink endpoint connections to the fleet's services.

fleetcast.contract.connections says which accounts the config allows per region (shared with the
auto-approver Lambda's deployment), `aws` makes the calls, `review` decides,
`audit` records each decision. The CLI is scripts/connections_cmd.py.
"""

from fleetcast.contract.connections import account_of, allowed_accounts
from fleetcast.contract.names import FLEET_TAG

from .audit import AuditLog, AuditRecord
from .aws import Access, AwsCallError, PermissionDenied, iam_action
from .review import SERVICE_ID_OUTPUT, Connection, Reviewer, ServiceRef

__all__ = [
    "Access", "AuditLog", "AuditRecord", "AwsCallError", "Connection", "FLEET_TAG", "PermissionDenied", "Reviewer", "SERVICE_ID_OUTPUT",
    "ServiceRef", "account_of", "allowed_accounts", "iam_action",
]
