"""Warming the passage store ahead of questions: POST /v1/passages/warm."""
