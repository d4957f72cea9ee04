"""The rule and the truth: the float64 oracle, the one tolerance rule and its error statistic,
where the references and the checks compute, and the named verdicts. Nothing here runs an
implementation (that is judgement/'s).
"""
