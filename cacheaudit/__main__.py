"""`python -m cacheaudit`: the same as the `cacheaudit` command."""

import sys

from cacheaudit.cli import main

sys.exit(main())
