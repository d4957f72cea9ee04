"""A case becomes tensors: deterministic values from the data seed, guarded storage and
layouts, NaN-filled allocations, one-copy transfers.
"""
