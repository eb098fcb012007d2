"""Run one notice watcher by hand: ``python -m cloud_elastic.notices aws``.

Prints each notice as a JSON line on stdout and the watcher's own log on
stderr, until interrupted or, with ``--for SECONDS``, until that time has
passed. Exit code 2 for a bad argument or endpoint variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys
import time

from cloud_elastic.errors import ConfigError

from .factory import CLOUDS, endpoint_for, watcher_for

#: How often ``--acknowledge`` acknowledges the terminate events reported since (no request when there is none).
ACK_EVERY_S = 0.2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cloud_elastic.notices", description=__doc__.splitlines()[0])
    parser.add_argument("cloud", choices=CLOUDS)
    parser.add_argument("--host", default=None, help="this host's address, for {host} in an endpoint variable "
                        "(default: this machine's hostname)")
    parser.add_argument("--for", dest="duration", type=float, default=None, metavar="SECONDS",
                        help="stop after this long (default: run until interrupted)")
    parser.add_argument("--acknowledge", action="store_true",
                        help="Azure: acknowledge each terminate event as soon as it is seen")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    host = args.host or socket.gethostname()
    try:
        watcher = watcher_for(args.cloud, host)
        url = endpoint_for(args.cloud, host, os.environ)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if watcher is None:
        print("error: AWS_EC2_METADATA_DISABLED=true turns the aws watcher off", file=sys.stderr)
        return 2
    print(f"watching {url} ({watcher.source}); Ctrl-C to stop", file=sys.stderr)

    def report(notice) -> None:
        print(json.dumps(dataclasses.asdict(notice)), flush=True)

    watcher.start(report)
    end = None if args.duration is None else time.monotonic() + args.duration
    try:
        while end is None or time.monotonic() < end:
            left = ACK_EVERY_S if end is None else min(ACK_EVERY_S, end - time.monotonic())
            time.sleep(max(0.0, left))
            if args.acknowledge:
                # Not from report(): a notice counts as reported (and so may be acknowledged) only once
                # report() has returned. Acknowledges what was reported since; a failure is retried here.
                watcher.acknowledge()
    except KeyboardInterrupt:
        pass
    finally:
        watcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
