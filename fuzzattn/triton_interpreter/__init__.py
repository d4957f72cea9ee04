"""Triton backend selection and every repair of Triton's CPU interpreter, fenced by the
Triton versions they were tested on.
"""
