"""Running an implementation under test: where it is found (registry, loader), the one way
it is called, and the side effects only a run can show.
"""
