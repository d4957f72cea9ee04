"""`python -m fuzzattn.cli ...`, the same as the `fuzzattn` command."""
import sys

from fuzzattn.cli import main

sys.exit(main())
