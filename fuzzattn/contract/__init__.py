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
from fuzzattn.contract.capabilities import Capabilities, UnsupportedCaseError, refuse
from fuzzattn.contract.case import AttentionCase, CaseError
from fuzzattn.contract.implementation import ContractError, Implementation
from fuzzattn.contract.known_defects import KnownDefect

__all__ = ["AttentionCase", "Capabilities", "CaseError", "ContractError", "Implementation",
           "KnownDefect", "UnsupportedCaseError", "refuse"]
