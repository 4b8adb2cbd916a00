"""`python -m qforge.cli`: the qforge command."""

import sys

from qforge.cli import main

sys.exit(main())
