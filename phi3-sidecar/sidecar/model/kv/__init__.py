"""The KV memory of the model worker: the conversation cache (prompt_cache.py) and where its
conversations live (tiers.py: a slot, compact RAM, compact.py, or disk, disk.py in folder.py's
directory), the one bound on all of it (bound.py), the idle worker's work ahead (idle.py,
warm.py), the operator's shared prefixes (shared_prefix.py) and moving a slot's pages
(pages.py)."""
