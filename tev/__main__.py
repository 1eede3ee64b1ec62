"""``python -m tev``: see :mod:`tev.cli`."""

import sys

from tev.cli import main

if __name__ == "__main__":
    sys.exit(main())
