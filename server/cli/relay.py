"""``geofl relay``: a regional relay between the coordinator and its region's clients.

Only :mod:`argparse` is imported at the top, so building the ``geofl`` parser stays cheap
(and ``geofl client`` keeps working on a machine with only the client's dependencies).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

#: Settings a dedicated flag sets: (flag, destination in args, key path, converter).
_FLAGS: tuple[tuple[str, str, str, Any], ...] = (
    ("--server", "server", "upstream.address", str),
    ("--region", "region", "relay.region", str),
    ("--listen", "listen", "server.address", str),
    ("--name", "name", "relay.name", str),
    ("--local-rounds", "local_rounds", "relay.local_rounds", int),
    ("--clients-per-round", "clients_per_round", "relay.clients_per_round", int),
    ("--min-clients", "min_clients", "relay.min_clients", int),
    ("--deadline", "deadline", "schedule.deadline_s", float),
    ("--wait-for-clients", "wait_for_clients", "schedule.wait_for_clients_s", float),
    ("--root-certificates", "root_certificates", "upstream.root_certificates", Path),
    ("--tls-cert", "tls_cert", "server.tls.cert", Path),
    ("--tls-key", "tls_key", "server.tls.key", Path),
    ("--node-key", "node_key", "upstream.node_key", Path),
    ("--upstream-tls-cert", "upstream_tls_cert", "upstream.tls_cert", Path),
    ("--upstream-tls-key", "upstream_tls_key", "upstream.tls_key", Path),
    ("--reconnect-for", "reconnect_for", "upstream.reconnect_for_s", float),
    ("--state-dir", "state_dir", "upstream.state_dir", Path),
)
_HELP = {
    "--server": ("HOST:PORT", "the coordinator (upstream.address)"),
    "--region": ("REGION", "the region this relay serves (relay.region); required"),
    "--listen": ("HOST:PORT", "where the region's clients connect (server.address); required"),
    "--name": ("NAME", "node name at the coordinator (default relay-REGION)"),
    "--local-rounds": ("N", "regional rounds per coordinator task (default 1)"),
    "--clients-per-round": ("N", "local clients per regional round (default: all connected)"),
    "--min-clients": ("N", "local results a regional round needs (default 1)"),
    "--deadline": ("SECONDS", "deadline of a regional round (schedule.deadline_s)"),
    "--wait-for-clients": ("SECONDS", "how long to wait for min-clients local clients"),
    "--root-certificates": ("PEM", "CA certificate(s) to verify the coordinator's TLS"),
    "--tls-cert": ("PEM", "certificate chain served to the region's clients"),
    "--tls-key": ("PEM", "private key of --tls-cert"),
    "--node-key": ("NAME.key", "Ed25519 key proving the relay's identity upstream"),
    "--upstream-tls-cert": ("PEM", "mutual TLS: the relay's certificate towards the coordinator"),
    "--upstream-tls-key": ("PEM", "mutual TLS: the key of --upstream-tls-cert"),
    "--reconnect-for": ("SECONDS", "give up after the coordinator was unreachable this long"),
    "--state-dir": ("DIR", "keep upload-compression state here across restarts"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The relay's options; each dedicated flag overrides the YAML file's value."""
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        metavar="RELAY.yaml",
        help="optional YAML settings (sections relay, upstream, server, schedule, "
        "secure_aggregation); flags override them",
    )
    for flag, dest, _, convert in _FLAGS:
        metavar, text = _HELP[flag]
        parser.add_argument(flag, dest=dest, type=convert, metavar=metavar, help=text)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override any setting, e.g. --set secure_aggregation.enabled=true (repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")


def _flag_overrides(args: argparse.Namespace) -> list[Any]:
    from geofl.server.relay import flag_override

    found = []
    for flag, dest, path, _ in _FLAGS:
        value = getattr(args, dest)
        if value is None:
            continue
        if isinstance(value, Path):
            value = str(value.absolute())  # flags are relative to the working directory
        found.append(flag_override(flag, path, value))
    return found


def run_relay(args: argparse.Namespace) -> int:
    """Run ``geofl relay``; returns the exit code."""
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s relay %(name)s: %(message)s",
    )
    from geofl.server.cli.exit_codes import ExitCode, exit_code_for
    from geofl.server.config import ConfigError
    from geofl.server.relay import Relay, load_relay_config

    try:
        config = load_relay_config(
            args.config, flags=_flag_overrides(args), overrides=args.overrides
        )
        relay = Relay(config)
        port = relay.start()
        _say(
            f"region {config.relay.region} listening on port {port}; "
            f"coordinator {config.upstream.address}"
        )
        relay.run()
    except BaseException as exc:  # exit_code_for re-raises what has no exit code
        code = exit_code_for(exc)
        if code is ExitCode.INTERRUPTED:
            return _fail(code, "interrupted")
        return _fail(code, _with_flags(exc) if isinstance(exc, ConfigError) else str(exc))
    _say("run over")
    return int(ExitCode.OK)


def _with_flags(error: Any) -> str:
    """The problems, each missing setting with the flag that sets it."""
    flags = {path: flag for flag, _, path, _ in _FLAGS}
    lines = []
    for problem in error.problems:
        flag = flags.get(problem.path)
        missing = flag is not None and "missing" in problem.message
        lines.append(f"{problem} (set it with {flag})" if missing else str(problem))
    return "\n".join(lines)


def _say(message: str) -> None:
    print(f"geofl relay: {message}", file=sys.stderr, flush=True)


def _fail(code: int, message: str) -> int:
    _say(f"error: {message}")
    return int(code)


__all__ = ["add_arguments", "run_relay"]
