"""The instances' user data, rendered by the runtime's own modules (runtime/userdata.py, runtime/probe/userdata.py).

The runtime package has its repository name here and its product name in an installed wheel
(fleetcast/contract/packaging.py: `stacks` is `fleetcast_cdk` there, `runtime` is `fleetcast_runtime`), so this
package imports it under the name that goes with its own: never a `runtime` of the team's app.
"""

from __future__ import annotations

if __package__ == "stacks":
    from runtime.probe.userdata import render_probe_user_data
    from runtime.userdata import render_user_data
else:
    from fleetcast_runtime.probe.userdata import render_probe_user_data
    from fleetcast_runtime.userdata import render_user_data

__all__ = ["render_probe_user_data", "render_user_data"]
