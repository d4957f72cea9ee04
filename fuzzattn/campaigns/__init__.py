"""Campaigns: drawing and judging cases until a budget ends, and what they leave behind.

Each distinct defect shrunk once, regression files written and replayed, Hypothesis's example
database, configurations pruned as Triton's autotuner would, and the Outcome every report reads.
"""
