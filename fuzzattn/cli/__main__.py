"""`python -m fuzzattn.cli ...`, the same as the `fuzzattn` command."""
import sys

from fuzzattn.cli.watched import console_main

sys.exit(console_main())
