"""``python -m tools.docgen --write | --check``."""

import sys

from . import main

sys.exit(main())
