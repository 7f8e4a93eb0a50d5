"""The contract layer: facts that stacks, the instance runtime and the CLIs must agree on.

Each fact has its one home here: derived names, stack output keys, the instance environment,
the support matrix, the error hierarchy. Standard library only, and nothing of the project
is imported, so the GPU instance ships it and every layer above may import it.
"""
