"""Process and device tuning: how the CPU waits for the GPU, the garbage collector's
passes, and the versions a judged case ran with.
"""
