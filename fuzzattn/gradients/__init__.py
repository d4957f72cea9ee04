"""Gradients: dq, dk, dv judged against float64 autograd of the oracle, with the checks
value comparison cannot see.
"""
