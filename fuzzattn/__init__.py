"""fuzzattn: differential fuzz testing for attention kernels."""
from .case import AttentionCase
from .contract import Capabilities, Implementation, UnsupportedCaseError, refuse
from .judge import Report, judge
from .verdict import Verdict

__version__ = "0.1.0"

__all__ = ["AttentionCase", "Capabilities", "Implementation", "Report", "UnsupportedCaseError",
           "Verdict", "judge", "refuse", "__version__"]
