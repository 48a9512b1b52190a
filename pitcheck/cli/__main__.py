"""`python -m pitcheck.cli`."""
import sys

from . import main

sys.exit(main())
