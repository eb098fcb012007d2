"""The ``cloud-elastic`` command line (click). Thin: parse, validate, hand over.

Exit codes: 0 success; 1 the job failed (the last line says why); 2 invalid
flags or configuration (nothing was started); 129/130/143 interrupted by
SIGHUP/SIGINT/SIGTERM (every worker was stopped first).

Importing this module imports click and nothing heavy: no torch, no cloud
SDK, so ``--help``, ``providers`` and shell completion stay fast. Each
command imports what it needs when it runs.

Shell completion (click's): ``eval "$(_CLOUD_ELASTIC_COMPLETE=bash_source cloud-elastic)"``
(``zsh_source``, ``fish_source`` for the other shells).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import sys
from typing import Any, Sequence

import click

from cloud_elastic import __version__
from cloud_elastic.errors import CloudElasticError, ConfigError
from cloud_elastic.providers.selection import DiscoveryArgs, discovery_options

__all__ = ["main", "cli", "job_config", "parse_command_line"]

PROG = "cloud-elastic"
_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


class _Group(click.Group):
    """Subcommands listed in the order they are defined, not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


@click.group(cls=_Group, context_settings=_CONTEXT, invoke_without_command=True)
@click.version_option(__version__, "--version", prog_name=PROG, message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Elastic PyTorch training on cloud autoscaling groups."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help(), err=True)
        ctx.exit(2)


@cli.command(
    context_settings={**_CONTEXT, "allow_interspersed_args": False},
    short_help="run an elastic training job",
)
@click.option("-np", "--num-proc", type=int, required=True, metavar="N",
              help="workers to start training with: the first round forms once N are ready; workers started "
                   "on further free slots, up to --max-np, join as a scale-up")
@click.option("--min-np", type=int, metavar="N", help="fewest workers to keep training with (default: -np)")
@click.option("--max-np", type=int, metavar="N", help="most workers to scale up to (default: -np, as in Horovod)")
@discovery_options
@click.option(
    "--blacklist-cooldown-range", type=float, nargs=2, metavar="MIN MAX", default=(10.0, 300.0),
    help="a failed slot is blocked for MIN*2^(failures-1) seconds, at most MAX (default 10 300; 0 0: any "
         "failure of its worker, a kill from outside too, blocks it for the rest of the job, as Horovod's "
         "default); 3 failures of its worker's own doing (not a kill from outside) in a row without progress "
         "(no commit of a state not trained before) block it "
         "for the rest of the job, even if its host leaves discovery and comes back as the same instance",
)
@click.option("--reset-limit", type=int, metavar="N", help="fail the job after N resets (default: no limit)")
@click.option("--restarts", type=click.IntRange(min=0), default=0, metavar="N",
              help="a script without hvd.elastic.run runs as a fixed-size job: after a failure, start it "
                   "again on every slot, up to N times (default 0; its own checkpoint resumes it)")
@click.option("--elastic-timeout", type=float, metavar="SECONDS",
              help="how long to wait below --min-np before failing (default $CLOUD_ELASTIC_ELASTIC_TIMEOUT, else "
                   "$HOROVOD_ELASTIC_TIMEOUT, else 600); host discovery failing alone never ends a job at --min-np "
                   "or more: it trains on with its current hosts")
@click.option("--start-timeout", type=float, default=600.0, metavar="SECONDS",
              help="how long to wait for -np slots and for workers to start; once the job runs, also for a "
                   "joining worker's set-up before its first hvd.rank()/size()/elastic.run (default 600)")
@click.option("--heartbeat-timeout", type=float, default=5.0, metavar="SECONDS",
              help="a worker silent this long is given up and its round aborted (default 5, at least 1); one that its peers "
                   "wait for in a collective is given up sooner, once silent past its own limit (1.5 s or more)")
@click.option("--progress-timeout", type=float, default=120.0, metavar="SECONDS",
              help="a round in which no worker commits, steps, completes a collective or runs Python code this "
                   "long is aborted, its workers' stacks logged first (default 120, at least 5; 0 never)")
@click.option("--finish-timeout", type=float, metavar="SECONDS",
              help="once training completed (rank 0 returned from its training function), stop workers still "
                   "running this long after it (a final save, an evaluation) and fail the job (default: wait while "
                   "they answer heartbeats, as horovodrun does); a peer that returned first waits for rank 0 however "
                   "long, bounded only by --progress-timeout and heartbeats")
@click.option("--straggler-factor", type=float, default=2.0, metavar="X",
              help="drain a worker whose compute time per step stays X times the round's median for "
                   "--straggler-window (default 2; 0 never, and no host is drained for a slow network either)")
@click.option("--straggler-window", type=float, default=60.0, metavar="SECONDS",
              help="how long a worker must stay that slow to be drained (default 60)")
@click.option("--whole-hosts", is_flag=True,
              help="a host is the unit: its --slots-per-host workers start, join rounds and leave together (one "
                   "failing takes the others with it); -np, --min-np and --max-np must be multiples of it")
@click.option("--spares", type=int, default=0, metavar="N",
              help="start up to N workers beyond --max-np (N whole hosts with --whole-hosts) that connect and wait "
                   "outside the rounds: a lost or leaving worker's place is taken in the same round (default 0)")
@click.option("--fallback-after", type=float, metavar="SECONDS",
              help="with several host sources: below -np from the preferred ones this long, the fallback source "
                   "tops the job up to -np (default: the fallback only below --min-np)")
@click.option("--manage-capacity", is_flag=True,
              help="raise the fallback group's desired capacity when the job needs it, and set it back to 0 after "
                   "(AWS, GCP, Azure; default: the driver never changes a group)")
@click.option("--discovery-interval", type=float, default=1.0, metavar="SECONDS",
              help="seconds between discovery calls (default 1, at least 0.1; up to 30 apart while they fail)")
@click.option("--host-missing-grace", type=float, default=10.0, metavar="SECONDS",
              help="a host gone from discovery without a draining state is removed after this long (default 10)")
@click.option("--checkpoint-dir", metavar="URL", help="durable checkpoints: a local path or fsspec URL (default: none)")
@click.option("--checkpoint-interval", type=float, metavar="SECONDS",
              help="seconds between durable checkpoints (default 300; needs --checkpoint-dir)")
@click.option("--checkpoint-keep", type=int, metavar="N",
              help="durable checkpoints to keep (default 2; needs --checkpoint-dir)")
@click.option("--driver-grace", type=float, default=60.0, metavar="SECONDS",
              help="how long workers keep training without a driver before they stop (default 60)")
@click.option("--notice-watcher", type=click.Choice(["auto", "aws", "gcp", "azure", "none"]), default="auto",
              help="instance-metadata notice watcher on worker hosts (default auto: from the provider)")
@click.option("--drain-on-rebalance", is_flag=True,
              help="treat a rebalance recommendation or maintenance event like a termination notice")
@click.option("--events-file", metavar="PATH", help="write the job's events as JSON lines (see docs/events.md)")
@click.option("--metrics-port", type=int, metavar="PORT",
              help="serve Prometheus metrics on this port (needs [metrics])")
@click.option("--metrics-addr", default="127.0.0.1", metavar="ADDR",
              help="address the metrics server binds (default 127.0.0.1: this machine only; 0.0.0.0: every "
                   "interface, unauthenticated)")
@click.option("--ssh-port", type=int, metavar="PORT", help="ssh port on the hosts (default: ssh's)")
@click.option("--ssh-identity-file", metavar="PATH", help="private key for ssh")
@click.option("--ssh-user", metavar="USER", help="user to log in as")
@click.option("--ssh-option", multiple=True, metavar="OPTION",
              help="extra 'ssh -o' option, e.g. StrictHostKeyChecking=accept-new (repeatable)")
@click.option("--driver-address", metavar="ADDR",
              help="address workers use to reach the driver (default: picked from the route to the hosts)")
@click.option("--network-interface", metavar="NIC", help="network interface Gloo/NCCL use on the workers")
@click.option("--force-ssh", is_flag=True, hidden=True)
@click.option("-x", "--env", multiple=True, metavar="NAME[=VALUE]",
              help="forward an environment variable to the workers (repeatable)")
@click.option("--ray-address", metavar="ADDR",
              help="run the workers as Ray actors on this Ray cluster ('auto' on a cluster node); Ray is the host "
                   "source then (needs [ray], see docs/ray.md)")
@click.option("--ray-use-gpu", is_flag=True, help="with --ray-address: one slot per GPU (default: per --ray-cpus-per-slot CPUs)")
@click.option("--ray-cpus-per-slot", type=float, default=1.0, metavar="N",
              help="with --ray-address: CPUs reserved per worker (default 1)")
@click.option("--verbose", is_flag=True, help="debug logging")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="COMMAND...")
def run(discovery: DiscoveryArgs, **params: Any) -> int:
    """Run COMMAND as one worker per slot on the discovered hosts, elastically.

    COMMAND is everything after the options (its own flags are passed to it);
    '--' before it is also accepted.
    """
    from cloud_elastic.providers.selection import build_discovery

    ray_address = params.pop("ray_address")
    ray_use_gpu, ray_cpus = params.pop("ray_use_gpu"), params.pop("ray_cpus_per_slot")
    if not (math.isfinite(ray_cpus) and 0 < ray_cpus <= 1024):
        raise ConfigError(f"--ray-cpus-per-slot must be a finite number above 0 and at most 1024, got {ray_cpus!r}")
    if ray_address is None and (ray_use_gpu or ray_cpus != 1.0):
        raise ConfigError(f"{'--ray-use-gpu' if ray_use_gpu else '--ray-cpus-per-slot'} needs --ray-address")
    config = job_config(params, discovery)
    launcher = None
    if ray_address is not None:
        if config.whole_host_slots:
            raise ConfigError("--whole-hosts does not work with --ray-address yet (Ray's hosts are its nodes)")
        if discovery.hosts or discovery.host_discovery_script or discovery.provider or discovery.cloud:
            raise ConfigError("--ray-address is the host source: drop -H, --host-discovery-script, --provider "
                              "and the cloud group flags")
        from cloud_elastic.ray import build_ray_run

        ray_run = build_ray_run(ray_address, config, use_gpu=ray_use_gpu, cpus_per_slot=ray_cpus,
                                slots_per_host=discovery.slots_per_host)
        config, built, launcher = ray_run.config, ray_run.discovery, ray_run.launcher
    else:
        from cloud_elastic.providers.static import never_enough

        from cloud_elastic.providers.multi import check_job_flags

        built = build_discovery(discovery)
        check_job_flags(built, manage_capacity=config.manage_capacity, fallback_after_s=config.fallback_after_s)
        why = never_enough(built, config.num_proc, config.whole_host_slots)
        if why is not None:
            raise ConfigError(why)
    from cloud_elastic.driver.job.notice_policy import watched_cloud
    from cloud_elastic.driver.runtime.processes import forwarded_env, launches_locally
    from cloud_elastic.driver.launch import forkserver
    from cloud_elastic.notices.factory import check_endpoint
    from cloud_elastic.worker.settings import check_environ

    # What the workers or the driver would refuse later, refused now, before anything is started or written:
    # a malformed endpoint override or worker setting, in the environment the workers get (-x/--env over the
    # driver's, which only the workers it starts itself inherit: -H local hosts), and a bad
    # CLOUD_ELASTIC_LOCAL_FORKSERVER (read by the driver's local launcher).
    forwarded = forwarded_env(config.forward_env)
    unset = [name for name in config.forward_env if "=" not in name and name not in forwarded]
    if unset:  # a forgotten export: the workers run without it, remote ones silently (local ones inherit anyway)
        sys.stderr.write(f"{PROG}: warning: -x {', '.join(unset)}: not set in the driver's environment, so not passed "
                         "to the workers (export it, or give -x NAME=VALUE)\n")
    local = launcher is None and bool(discovery.hosts) and any(
        launches_locally(host, config.force_ssh) for host in built.find().ready)  # -H: no I/O
    inherited = os.environ if local else {}
    if config.network_interface and launcher is None and discovery.hosts:
        from cloud_elastic.driver.launch.api import is_local_host
        from cloud_elastic.worker.interface import missing_interface

        here = next((host for host in built.find().ready if is_local_host(host)), None)
        missing = missing_interface(config.network_interface, f"this machine (-H {here})") if here else None
        if missing:  # its workers' every round would fail until --elastic-timeout (see worker.interface)
            raise ConfigError(missing)
    check_endpoint(watched_cloud(config.notice_watcher, str(getattr(built, "name", ""))), {**inherited, **forwarded})
    check_environ(inherited, forwarded, checkpointing=config.checkpoint_dir is not None)
    forkserver.enabled()
    forgotten = forgotten_value("--checkpoint-dir", config.checkpoint_dir, config.command)
    if forgotten:
        sys.stderr.write(f"{PROG}: warning: {forgotten}\n")
    _setup_logging(config.verbose)
    from cloud_elastic.driver.job.actions import INTERRUPTED
    from cloud_elastic.driver.runtime.driver import Driver

    driver = Driver(config, built, launcher=launcher, discovery_timeout_s=discovery.discovery_timeout)
    # SIGHUP too: the terminal of a driver started over ssh closing (a dropped session) stops the job as Ctrl-C
    # does, at a commit with a checkpoint, where the signal's default action killed the driver with no last word
    # and left its workers to train on until their --driver-grace (review h13).
    names = {signal.SIGINT: ("interrupted by SIGINT", 130), signal.SIGTERM: ("terminated by SIGTERM", 143),
             signal.SIGHUP: ("hung up (SIGHUP)", 129)}
    for signum, (reason, code) in names.items():
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue  # started under nohup (or told so): a hang-up is to be ignored, as asked (review h15)
        signal.signal(signum, lambda _s, _f, r=reason, c=code: driver.interrupt(r, c))
    outcome = driver.run()
    verdict = "succeeded" if outcome.success else ("interrupted" if outcome.exit_code in INTERRUPTED else "failed")
    sys.stderr.write(f"{PROG}: job {driver.job_id} {verdict}: {outcome.reason}\n")
    return outcome.exit_code


def job_config(params: dict[str, Any], discovery: DiscoveryArgs | None = None):
    """The :class:`~cloud_elastic.config.JobConfig` of ``run``'s parsed options; ConfigError if invalid."""
    from cloud_elastic.config import JobConfig, SSHConfig, elastic_timeout_default

    if not params["command"]:
        raise ConfigError(f"no training command given (e.g. {PROG} run -np 2 -H localhost:2 python train.py)")
    slots = discovery.slots_per_host if discovery is not None else None
    if params.get("whole_hosts") and slots is None:
        raise ConfigError("--whole-hosts needs --slots-per-host N: the slots every host offers, all used together")
    num_proc = params["num_proc"]
    elastic_timeout = params["elastic_timeout"]
    config = JobConfig(
        command=tuple(params["command"]),
        num_proc=num_proc,
        min_np=params["min_np"] if params["min_np"] is not None else num_proc,
        max_np=params["max_np"] if params["max_np"] is not None else num_proc,
        elastic_timeout_s=elastic_timeout if elastic_timeout is not None else elastic_timeout_default(),
        start_timeout_s=params["start_timeout"],
        reset_limit=params["reset_limit"],
        restarts=params.get("restarts", 0),
        cooldown_range_s=tuple(params["blacklist_cooldown_range"]),
        heartbeat_timeout_s=params["heartbeat_timeout"],
        heartbeat_interval_s=min(0.5, params["heartbeat_timeout"] / 4),
        discovery_interval_s=params["discovery_interval"],
        driver_address=params["driver_address"],
        network_interface=params["network_interface"],
        forward_env=tuple(params["env"]),
        ssh=SSHConfig(
            port=params["ssh_port"],
            identity_file=params["ssh_identity_file"],
            user=params["ssh_user"],
            extra_options=tuple(params["ssh_option"]),
        ),
        verbose=params["verbose"],
        force_ssh=params["force_ssh"],
        host_missing_grace_s=params["host_missing_grace"],
        checkpoint_dir=params["checkpoint_dir"],
        **{name: params[flag] for name, flag in (("checkpoint_interval_s", "checkpoint_interval"),
                                                 ("checkpoint_keep", "checkpoint_keep")) if params[flag] is not None},
        driver_grace_s=params["driver_grace"],
        notice_watcher=params["notice_watcher"],
        drain_on_rebalance=params["drain_on_rebalance"],
        events_file=params["events_file"],
        metrics_port=params["metrics_port"],
        metrics_addr=params.get("metrics_addr", "127.0.0.1"),
        progress_timeout_s=params["progress_timeout"],
        finish_timeout_s=params.get("finish_timeout"),
        straggler_factor=params["straggler_factor"],
        straggler_window_s=params["straggler_window"],
        whole_host_slots=slots if params.get("whole_hosts") and slots else 0,
        fallback_after_s=params.get("fallback_after"),
        manage_capacity=params.get("manage_capacity", False),
        spares=params.get("spares", 0),
    )
    if config.checkpoint_dir is not None and not config.checkpoint_dir.strip():
        # An unset $CKPT: taken as given, the checkpoints (and the driver's record) went to the current directory.
        raise ConfigError("--checkpoint-dir is empty: give a directory or a URL (s3://, gs://, az://...) for the "
                          "durable checkpoints")
    given = [f"--{flag.replace('_', '-')}" for flag in ("checkpoint_interval", "checkpoint_keep")
             if params[flag] is not None]
    if given and not config.checkpoint_dir:  # the defaults could not be told from a value typed (review s63 rvU)
        raise ConfigError(f"{' and '.join(given)} given without --checkpoint-dir: no durable checkpoint would be "
                          "written (add --checkpoint-dir PATH_OR_URL)")
    if config.driver_address:
        _check_resolves(config.driver_address)
    return config


def forgotten_value(option: str, value: str | None, command: Sequence[str]) -> str | None:
    """A warning when ``option``'s ``value`` looks like the command's own interpreter, taken as the option's value
    because the value was forgotten (``--checkpoint-dir python train.py``): ``value`` is a program on PATH and no
    path here, and the command left starts with a script that is no program (``train.py``); else None."""
    import shutil

    if not value or not command or os.sep in value or os.path.exists(value) or not shutil.which(value):
        return None
    script = command[0]
    if os.path.splitext(script)[1] not in _SCRIPTS or shutil.which(script):
        return None
    return (f"{option} {value!r} names a program, and the command left starts with the script {script!r}, "
            f"which is no program: was {option}'s value forgotten? ({option} DIR {value} {script} ...)")


#: What a script run by an interpreter ends with (:func:`forgotten_value`).
_SCRIPTS = (".py", ".sh", ".pl", ".rb", ".js")


def _check_resolves(address: str) -> None:
    """A ``--driver-address`` name that does not resolve here is refused now: the workers would otherwise retry
    registering until --start-timeout and the job end without the cause."""
    import socket

    try:
        socket.getaddrinfo(address, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ConfigError(f"--driver-address {address!r} does not resolve to an IPv4 address ({why})") from None


def parse_command_line(argv: Sequence[str]) -> tuple[str, dict[str, Any], DiscoveryArgs | None]:
    """Parse ``argv`` (subcommand first) without running anything: ``(subcommand, params, discovery)``.

    For ``run``, ``params["config"]`` is the validated JobConfig. Raises
    click.UsageError or ConfigError as the command line would report them.
    """
    name, *rest = argv
    command = cli.commands[name]
    with command.make_context(f"{PROG} {name}", list(rest)) as ctx:
        params = dict(ctx.params)
    discovery = DiscoveryArgs.pop_from(params) if name in ("run", "discover") else None
    if name == "run":
        params["config"] = job_config(params, discovery)
    return name, params, discovery


@cli.command(context_settings=_CONTEXT, short_help="print the hosts a provider reports, as the driver would see them")
@discovery_options
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
@click.option("--verbose", is_flag=True, help="debug logging")
def discover(discovery: DiscoveryArgs, as_json: bool, verbose: bool) -> int:
    """Print the hosts a provider reports, as the driver's first poll would see them."""
    from cloud_elastic.driver.runtime.discovery import discover as run_discovery
    from cloud_elastic.providers.selection import build_discovery

    built = build_discovery(discovery)
    _setup_logging(verbose)
    return run_discovery(built, as_json=as_json, out=sys.stdout,  # it closes the provider
                         timeout_s=discovery.discovery_timeout)


@cli.command(context_settings=_CONTEXT, short_help="list the installed discovery providers and their options")
def providers() -> int:
    """List the installed discovery providers, their options and whether their SDK is installed."""
    from cloud_elastic.providers.inspect import list_providers

    list_providers(sys.stdout)
    return 0


@cli.command(context_settings=_CONTEXT, short_help="show running jobs, or one job's state")
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True,
              help="print JSON: the driver's reply with JOB (a job that ended lately: its job, running false, "
                   "ended_at and how), else the list of jobs (one shape for scripts, however many run)")
@click.option("--all", "show_all", is_flag=True,
              help="also list drivers gone for longer than their --driver-grace")
def status(job: str | None, as_json: bool, show_all: bool) -> int:
    """List the jobs running on this machine, or show JOB: phase, round, hosts, workers, commits.

    Without JOB: the list, or the one job's status when exactly one is running. The
    list holds running drivers and those gone within their --driver-grace (their
    workers may still run); a record gone a day past its grace is deleted. A JOB
    that ended lately is said to have ended, how and when (exit status 0); a JOB
    never seen here is an error (exit status 2).

    Asks the job's driver over its authenticated control plane; only the user
    who started the job can read its secret, so only that user can ask.
    """
    from cloud_elastic import records, status as st

    import json

    if job is None:
        jobs, hidden = st.listed_jobs(show_all=show_all)
        alive = [j for j in jobs if j.alive]
        if as_json:
            json.dump([dataclasses.asdict(j) for j in jobs], sys.stdout, indent=2)
            sys.stdout.write("\n")
            return 0
        if len(alive) != 1:
            sys.stdout.write(st.render_job_list(jobs, hidden=hidden))
            return 0
        job = alive[0].job_id  # the usual case: one job on this machine, show it
    try:
        reply = st.query_status(job)
    except ConfigError:
        ended, line = records.ended_info(job), records.ended_line(job)
        if ended is None or line is None:
            raise
        # A job that ended lately is an answer, not a mistake on the command line (exit 2): said on stdout with
        # exit 0, as JSON for scripts (review h9: --json printed the text line alone), and in one line for people.
        if as_json:
            json.dump({"job": job, "running": False, "ended_at": ended[0], "how": ended[1]}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(line + "\n")
        return 0
    if as_json:
        json.dump(reply.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(st.render_status(reply))
    return 0


@cli.command(context_settings=_CONTEXT, short_help="drain a host or one slot of a running job")
@click.argument("job")
@click.argument("target", metavar="HOST[:SLOT]")
def drain(job: str, target: str) -> int:
    """Drain TARGET from JOB: its workers leave at their next commit, with no rollback, as on a spot notice.

    A drained slot is blacklisted with the usual cooldown, so the job takes a
    replacement when discovery offers one; a drained host gets no new worker
    until it leaves discovery (with a fixed -H list: for the rest of the job),
    unlike a cloud's notice, which lapses when the cloud keeps the host. The
    reply warns when the drain leaves room for fewer workers than --min-np (the
    workers that stay and the free slots; under --whole-hosts, whole hosts'),
    and says what the job does: with discovery it waits for more, up to
    --elastic-timeout; with a fixed -H list it waits for slots cooling down or
    on a host with a notice, up to --elastic-timeout, and ends once the drained
    workers have left if even those are too few. A script without
    hvd.elastic.run cannot leave at a commit: until a worker has entered it,
    the driver cannot tell such a script from one still in its set-up, and the
    reply says both: the drained workers leave at their first commit if the
    script enters hvd.elastic.run, or run to the end of the script if it never
    does. A drained worker not yet in a round (in its set-up before
    hvd.init()) is stopped either way; one whose training function returned
    stays until rank 0 returns from its own, then runs to the end of the script,
    unless that return proves early (rank 0, still in its loop, waits in a
    collective that needs it): it then leaves, and the others roll back to their
    last commit; the reply says both. So does the reply for a worker still
    training while a peer waits so: if rank 0 is past its loop, the worker runs
    to the end of the script, else it leaves at its next commit. A host or slot
    already draining is not drained again: the reply says it is.
    Signed like 'status': only the user who started the job can ask.
    """
    from cloud_elastic import status as st

    host, sep, slot = target.rpartition(":")
    if not sep:
        host, slot = target, ""
    if not host or (sep and not slot.isdigit()):  # no host name has a colon (IPv6 is not supported)
        raise click.UsageError(f"{target!r}: expected HOST or HOST:SLOT, SLOT a number")
    message = st.request_drain(job, host, int(slot) if slot else None)
    sys.stdout.write((message or f"draining {target}") + "\n")
    return 0


@cli.command(context_settings=_CONTEXT, short_help="draw a job's events file as a picture")
@click.argument("events_file", metavar="EVENTS_FILE", type=click.Path(dir_okay=False))
@click.option("-o", "--output", metavar="PNG", default="timeline.png", show_default=True,
              help="picture to write: its name ends in .png, .svg or .pdf")
def timeline(events_file: str, output: str) -> int:
    """Draw EVENTS_FILE (from 'run --events-file'): world size, workers per host slot,
    notices, rollbacks and the steps they lost. Needs the [plot] extra (matplotlib)."""
    from cloud_elastic.timeline import draw_timeline, read_events

    summary = draw_timeline(read_events(events_file), output)
    sys.stdout.write(f"{PROG}: wrote {output} ({summary})\n")
    return 0


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    root = logging.getLogger("cloud_elastic")
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def _usage_error(exc: click.UsageError) -> int:
    message = exc.format_message().rstrip(".")
    message = message[:1].lower() + message[1:]
    where = exc.ctx.command_path if exc.ctx is not None else PROG
    sys.stderr.write(f"{PROG}: error: {message} (see '{where} --help')\n")
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (0, 1, 2, 129, 130 or 143)."""
    try:
        code = cli.main(list(argv) if argv is not None else None, prog_name=PROG, standalone_mode=False)
        return code if isinstance(code, int) else 0
    except click.UsageError as exc:
        return _usage_error(exc)
    except ConfigError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    except CloudElasticError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 1
    except click.ClickException as exc:  # e.g. a file click could not open
        sys.stderr.write(f"{PROG}: error: {exc.format_message()}\n")
        return exc.exit_code
    except click.Abort:
        # Ctrl-C outside a running job (which handles SIGINT itself): nothing to stop.
        return 130
    except BrokenPipeError:
        # `cloud-elastic providers | head`: the reader left; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
