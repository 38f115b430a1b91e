"""``python -m mbr_launch`` is ``mbr-launch``."""

import sys

from .cli import main

sys.exit(main())
