"""Evaluation and reports."""
