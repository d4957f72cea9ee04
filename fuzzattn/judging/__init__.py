"""The judge: the float64 oracle, the one tolerance rule, the value checks and the named
verdicts of one implementation on one case.
"""
