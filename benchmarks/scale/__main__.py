"""``python -m benchmarks.scale``."""

import sys

from benchmarks.scale.main import main

sys.exit(main())
