"""``python -m benchmarks.bench``."""

import sys

from benchmarks.bench.main import main

sys.exit(main())
