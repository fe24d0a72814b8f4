"""`python -m flowrl.cli ...`: the same as the `flowrl` command (used by `accelerate launch -m flowrl.cli`)."""

import sys

from flowrl.cli import main

sys.exit(main())
