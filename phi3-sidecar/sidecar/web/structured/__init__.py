"""Structured output (response_format, tools): the grammar a reply is held to (guidance.py), what
a client's JSON Schema must be for a grammar to hold it (schema_rules.py), both settled before
admission (settle.py), and the check of the finished reply (reply_check.py)."""
