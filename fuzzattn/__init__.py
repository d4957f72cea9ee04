"""fuzzattn: differential fuzz testing for attention kernels."""
# Triton fixes its backend when first imported, so the interpreter (on machines without a GPU)
# is chosen before anything else in the package, or a user's code, can import triton.
from .interpreter import select_backend

select_backend()

# isort: split
from .case import AttentionCase
from .contract import Capabilities, Implementation, UnsupportedCaseError, refuse
from .judge import Report, judge
from .verdict import Verdict

__version__ = "0.1.0"

__all__ = ["AttentionCase", "Capabilities", "Implementation", "Report", "UnsupportedCaseError",
           "Verdict", "judge", "refuse", "__version__"]
