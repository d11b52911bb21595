"""Searching a person's library and grounding a chat in it: dense, keyword or fused search
(retrieval.py), the passages written into a grounded turn (grounding.py) and a reply's `[n]`
checked against them (citations.py).
"""
