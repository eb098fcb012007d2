"""The ``cloud-elastic`` command line. Thin: parse, validate, hand over.

Exit codes: 0 success; 1 the job failed (the last line says why); 2 invalid
flags or configuration (nothing was started); 130/143 interrupted by
SIGINT/SIGTERM (every worker was stopped first).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Sequence

from cloud_elastic import __version__
from cloud_elastic.errors import CloudElasticError, ConfigError

__all__ = ["main", "build_parser"]

class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"cloud-elastic: error: {message} (see '{self.prog} --help')\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    from cloud_elastic.providers.selection import add_discovery_arguments

    parser = _Parser(prog="cloud-elastic", description="Elastic PyTorch training on cloud autoscaling groups.")
    parser.add_argument("--version", action="version", version=f"cloud-elastic {__version__}")
    sub = parser.add_subparsers(dest="subcommand", parser_class=_Parser, metavar="{run,discover,providers}")

    run = sub.add_parser(
        "run", help="run an elastic training job", allow_abbrev=False,
        description="Run COMMAND as one worker per slot on the discovered hosts, elastically.",
    )
    size = run.add_argument_group("job size")
    size.add_argument("-np", "--num-proc", type=int, required=True, metavar="N", help="workers to start with")
    size.add_argument("--min-np", type=int, metavar="N", help="fewest workers to keep training with (default: -np)")
    size.add_argument("--max-np", type=int, metavar="N", help="most workers to scale up to (default: -np, as in Horovod)")
    add_discovery_arguments(run)
    el = run.add_argument_group("elasticity")
    el.add_argument(
        "--blacklist-cooldown-range", type=float, nargs=2, metavar=("MIN", "MAX"), default=(10.0, 300.0),
        help="a failed slot is blocked for MIN*2^(failures-1) seconds, at most MAX (default 10 300; 0 0 disables)",
    )
    el.add_argument("--reset-limit", type=int, metavar="N", help="fail the job after N resets (default: no limit)")
    el.add_argument(
        "--elastic-timeout", type=float, metavar="SECONDS",
        help="how long to wait below --min-np before failing (default 600, or $HOROVOD_ELASTIC_TIMEOUT)",
    )
    el.add_argument(
        "--start-timeout", type=float, default=600.0, metavar="SECONDS",
        help="how long to wait for -np slots and for workers to start (default 600)",
    )
    el.add_argument(
        "--heartbeat-timeout", type=float, default=5.0, metavar="SECONDS",
        help="a worker silent this long is given up and its round aborted (default 5)",
    )
    el.add_argument("--discovery-interval", type=float, default=1.0, metavar="SECONDS", help="seconds between discovery calls (default 1)")
    net = run.add_argument_group("remote hosts")
    net.add_argument("--ssh-port", type=int, metavar="PORT", help="ssh port on the hosts (default: ssh's)")
    net.add_argument("--ssh-identity-file", metavar="PATH", help="private key for ssh")
    net.add_argument("--ssh-user", metavar="USER", help="user to log in as")
    net.add_argument(
        "--ssh-option", action="append", default=[], metavar="OPTION",
        help="extra 'ssh -o' option, e.g. StrictHostKeyChecking=accept-new (repeatable)",
    )
    net.add_argument("--driver-address", metavar="ADDR", help="address workers use to reach the driver (default: picked from the route to the hosts)")
    net.add_argument("--network-interface", metavar="NIC", help="network interface Gloo/NCCL use on the workers")
    net.add_argument("--force-ssh", action="store_true", help=argparse.SUPPRESS)
    run.add_argument(
        "-x", "--env", action="append", default=[], metavar="NAME[=VALUE]",
        help="forward an environment variable to the workers (repeatable)",
    )
    run.add_argument("--verbose", action="store_true", help="debug logging")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the training command, e.g. python train.py")

    disc = sub.add_parser("discover", help="print the hosts a provider reports, as the driver would see them")
    add_discovery_arguments(disc)
    disc.add_argument("--json", action="store_true", help="print JSON instead of a table")
    disc.add_argument("--verbose", action="store_true", help="debug logging")

    sub.add_parser("providers", help="list the installed discovery providers and their options")
    return parser


def _job_config(args: argparse.Namespace):
    from cloud_elastic.config import JobConfig, SSHConfig, elastic_timeout_default

    elastic_timeout = args.elastic_timeout if args.elastic_timeout is not None else elastic_timeout_default()
    min_np = args.min_np if args.min_np is not None else args.num_proc
    max_np = args.max_np if args.max_np is not None else args.num_proc
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    return JobConfig(
        command=tuple(command),
        num_proc=args.num_proc,
        min_np=min_np,
        max_np=max_np,
        elastic_timeout_s=elastic_timeout,
        start_timeout_s=args.start_timeout,
        reset_limit=args.reset_limit,
        cooldown_range_s=tuple(args.blacklist_cooldown_range),
        heartbeat_timeout_s=args.heartbeat_timeout,
        heartbeat_interval_s=min(0.5, args.heartbeat_timeout / 4),
        discovery_interval_s=args.discovery_interval,
        driver_address=args.driver_address,
        network_interface=args.network_interface,
        forward_env=tuple(args.env),
        ssh=SSHConfig(
            port=args.ssh_port,
            identity_file=args.ssh_identity_file,
            user=args.ssh_user,
            extra_options=tuple(args.ssh_option),
        ),
        verbose=args.verbose,
        force_ssh=args.force_ssh,
    )


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("cloud-elastic: %(message)s"))
    root = logging.getLogger("cloud_elastic")
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def _cmd_run(args: argparse.Namespace) -> int:
    from cloud_elastic.providers.selection import build_discovery

    config = _job_config(args)
    discovery = build_discovery(args)
    _setup_logging(args.verbose)
    from cloud_elastic.driver.driver import Driver

    driver = Driver(config, discovery)
    names = {signal.SIGINT: ("interrupted by SIGINT", 130), signal.SIGTERM: ("terminated by SIGTERM", 143)}
    for signum, (reason, code) in names.items():
        signal.signal(signum, lambda _s, _f, r=reason, c=code: driver.stop(r, c))
    outcome = driver.run()
    verdict = "succeeded" if outcome.success else "failed"
    sys.stderr.write(f"cloud-elastic: job {driver.job_id} {verdict}: {outcome.reason}\n")
    return outcome.exit_code


def _cmd_discover(args: argparse.Namespace) -> int:
    from cloud_elastic.providers.inspect import discover
    from cloud_elastic.providers.selection import build_discovery

    _setup_logging(args.verbose)
    return discover(build_discovery(args), as_json=args.json, out=sys.stdout)  # discover() closes it


def _cmd_providers(args: argparse.Namespace) -> int:
    from cloud_elastic.providers.inspect import list_providers

    list_providers(sys.stdout)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.subcommand is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        if args.subcommand == "run":
            if not args.command:
                parser.error("no training command given (e.g. cloud-elastic run -np 2 -H localhost:2 python train.py)")
            return _cmd_run(args)
        if args.subcommand == "discover":
            return _cmd_discover(args)
        return _cmd_providers(args)
    except ConfigError as exc:
        sys.stderr.write(f"cloud-elastic: error: {exc}\n")
        return 2
    except CloudElasticError as exc:
        sys.stderr.write(f"cloud-elastic: error: {exc}\n")
        return 1
    except BrokenPipeError:
        # `cloud-elastic providers | head`: the reader left; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
