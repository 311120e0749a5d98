"""``kclasync multilang [--properties-file] FILE``: the file chosen as the daemon chooses it
(``--properties-file`` wins over the positional argument), every value decoded before anything
starts (a bad one: one line naming the key, exit status 1), the notes printed once, then the
worker run until it stops.

Must not: decode values (``settings``) or run the worker (``daemon``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from kclasync.multilang.daemon import print_notes, run_multilang
from kclasync.multilang.properties import PropertiesError
from kclasync.multilang.settings import load_settings


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    path = args.properties_option or args.properties
    if not path:
        parser.error("multilang: give the properties file (FILE or --properties-file FILE)")
    if args.properties_option and args.properties:
        print(
            "kclasync multilang: using the --properties-file option over the argument",
            file=sys.stderr,
        )
    try:
        settings = load_settings(path)
    except PropertiesError as exc:
        print(f"kclasync multilang: error: {exc}", file=sys.stderr)
        return 1
    print_notes(settings)
    if not args.verbose:
        # The children's stderr and the daemon's own errors are what an operator watches.
        logging.getLogger("kclasync.multilang").setLevel(logging.INFO)
    return asyncio.run(run_multilang(settings))
