"""The case and contract layer: plain data every other layer builds on.

    case          AttentionCase: one attention problem as sizes, flags and a data seed
    dtypes        the one dtype table
    capabilities  Capabilities: what an implementation declares, and how its inputs are checked
    implementation  Implementation: a named callable, and the contract's calling convention
    varlen        packed ragged batches: flash_attn_varlen_func's convention, spoken once
    known_defects KnownDefect: an upstream defect's input class, which campaigns pass over
    profiles      run profiles: how many cases and how large

Nothing here imports the engine, campaigns, the command line, strategies or kernels.
"""
# Re-exported on first use (PEP 562): the command line reads the dtype and profile tables here
# before anything needs torch, which capabilities and implementation import.
__all__ = ["AttentionCase", "Capabilities", "CaseError", "ContractError", "Implementation",
           "KnownDefect", "UnsupportedCaseError", "refuse"]


def __getattr__(name: str):
    if name in ("Capabilities", "UnsupportedCaseError", "refuse"):
        from fuzzattn.contract import capabilities as home
    elif name in ("AttentionCase", "CaseError"):
        from fuzzattn.contract import case as home
    elif name in ("ContractError", "Implementation"):
        from fuzzattn.contract import implementation as home
    elif name == "KnownDefect":
        from fuzzattn.contract import known_defects as home
    else:
        raise AttributeError(f"module 'fuzzattn.contract' has no attribute {name!r}")
    value = globals()[name] = getattr(home, name)      # later reads skip this function
    return value
