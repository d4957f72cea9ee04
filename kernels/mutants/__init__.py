"""The mutant zoo: seeded-bug variants of the real kernels, which the fuzzer must catch.

Each mutant is an `Implementation` named `mutant_<bug>`, with `mutant_of` naming the real
implementation it derives from, a one-line `description` of the planted bug, and the real one's
capabilities, so the fuzzer draws exactly the cases that can show the bug. They are registered
apart from the real implementations (fuzzattn.run.registry.mutants) and are never expected to pass:
`fuzzattn mutants` requires every one to be killed, and regressions/ ships one machine-found
fixture per mutant.

    triton_mutants  bugs in the Triton FA2 forward: kernel source edits and host-side launch errors
    torch_mutants   bugs in the tiled PyTorch forward and around SDPA (one only its autograd
                    gradients show)
    varlen_mutants  bugs in the packed varlen loop: a cross-sequence leak, a dropped sequence
    backward_mutants  bugs in the Triton FA2 backward, registered as triton_fa2 with a mutated
                    backward_fn: only the gradient checks can kill them
    edit            how a mutant is derived from a real function: one checked source edit
"""
from . import backward_mutants, torch_mutants, triton_mutants, varlen_mutants

MUTANTS = (triton_mutants.MUTANTS + torch_mutants.MUTANTS + varlen_mutants.MUTANTS
           + backward_mutants.MUTANTS)
