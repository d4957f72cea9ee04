"""Judging one implementation on one case: run it, compute the references, apply the rule to
each run and its gradients, and return the named verdicts. It sits above what it drives: the
rule and the oracle (judging/), the runs (run/) and the gradients (gradients/).
"""
