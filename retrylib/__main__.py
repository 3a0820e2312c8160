"""`python -m retrylib`: the `retrylib` command."""

import sys

from retrylib.ops.cli import main

sys.exit(main())
