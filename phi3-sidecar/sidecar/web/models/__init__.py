"""Several models behind one sidecar, by name (issue 56): the registry, the resident workers
within a memory budget, and their routes."""
