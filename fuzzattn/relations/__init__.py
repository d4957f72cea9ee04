"""Metamorphic relations: identities between two runs of one implementation, forward and
backward, judged by a written-down rounding model instead of an oracle.
"""
