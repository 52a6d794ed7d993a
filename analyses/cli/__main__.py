"""`python -m analyses.cli ...` (e.g. under `torchrun`) runs the `circuits` command line."""

import sys

from . import main

sys.exit(main())
