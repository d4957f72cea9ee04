"""Triton backend selection and every patch of Triton internals, fenced by the Triton versions
they were tested on (fence.TESTED): backend.py (backend choice, the bf16 dot and cast repairs and
their self-check), speed.py and semantic.py (interpreter costs removed without changing results).
"""
