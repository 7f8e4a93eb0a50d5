"""The contract layer: facts that the stacks, the instance runtime and the CLIs must agree on.

Standard library only, and nothing of the project is imported here, so every other
package (fleetcast.config, runtime, fleetcast.plan, stacks) can import it and it ships
in the runtime bundle without pulling anything else along.
"""
