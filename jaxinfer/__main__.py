"""`python -m jaxinfer` runs the CLI."""

import sys

from jaxinfer.entrypoints.cli import main

sys.exit(main())
