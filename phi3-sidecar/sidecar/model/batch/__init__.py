"""The batched path (DECODE_BATCH_ROWS > 1): the exported decoder run directly over a KV pool
(decoder.py), every reply in one model call per step (scheduler.py: replies joining and
leaving; step.py: one step; slots.py: the pool's slots; row.py: one reply), their tokens chosen
in numpy (sampling.py) under their grammars (guidance.py), set up as the settings ask
(setup.py)."""
