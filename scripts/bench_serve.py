"""Serving benchmark against a running `jaxinfer serve` (same as `jaxinfer bench serve`; see --help)."""

import sys

from jaxinfer.entrypoints.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "serve", *sys.argv[1:]]))
