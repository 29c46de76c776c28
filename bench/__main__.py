"""`python -m bench`: the `dmlbench` command without the installed script."""

import sys

from bench.cli import main

sys.exit(main())
