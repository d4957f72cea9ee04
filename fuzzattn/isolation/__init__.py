"""Judging in supervised worker processes: a kernel that hangs, dies or faults the device
becomes a verdict instead of ending the run.
"""
