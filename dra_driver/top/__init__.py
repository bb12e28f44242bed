"""``hami-dra top``: who uses which GPU, how full each card is, and why pods wait.

Read-only over the live cluster: ResourceSlices of our driver (the cards), allocated
ResourceClaims (the tenants) and Pods (the pods behind the claims, and the pods our controller
holds pending). The modules split at the I/O boundary so the whole view is testable without a
cluster: :mod:`.objects` parses API objects into typed records once, :mod:`.report` joins them
into per-card and per-node usage, :mod:`.render` prints tables or JSON, :mod:`.client` talks to
the API server and :mod:`.command` wires the subcommand.
"""

#: The two table views: one line per GPU (the default) or per node.
GPUS = "gpus"
NODES = "nodes"
