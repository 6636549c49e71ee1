"""Owns the local executor's job sandbox on the server's side: whether an attempt gets one, the
tools it needs, and the host firewall rule that keeps its network off this host.

The runner builds the sandbox (`sf.sandbox`: bubblewrap namespaces, pasta for outbound
connections, nsenter for each rank). What only the server can do is here:

- **Whether.** Every attempt whose job runs under `run_as` (the default when the server is
  root) is sandboxed, unless the cluster says `"sandbox": "none"`: then the job shares the
  host's network and process table, as before this existed, and `make run` says so. Jobs that
  run as the server's own user get none: they can read what the server can, and a network
  namespace would not change that (`trusts_jobs_like_the_server`).
- **The tools.** `bwrap`, `pasta`, `nsenter`, `setpriv` and `nft` (Debian: bubblewrap, passt,
  util-linux, nftables). A launch without them fails with a sentence that names what is
  missing; it never falls back to running the job unconfined.
- **The firewall.** pasta opens the job's outbound connections from this host, under the
  group `SF_SANDBOX_NET_GID`. The nftables table `inet starforge_sandbox` refuses that
  group's connections to any address of this host (its loopback included), and to private,
  shared, link-local and unique-local networks (another host's PostgreSQL or Redis, a cloud's
  metadata service) but for the host's DNS servers on port 53 and the networks the operator
  lists in `SF_SANDBOX_ALLOW_NETS` (a package mirror, a data server). It is applied before each
  sandboxed launch, atomically and idempotently, and concerns nothing but that group.
"""

from __future__ import annotations

import glob
import ipaddress
import os
import shutil
import stat
import subprocess
from pathlib import Path

from django.conf import settings

from jobs.executors.base import LaunchError

MODES = ("namespaces", "none")
TOOLS = ("bwrap", "pasta", "nsenter", "setpriv", "nft")
TABLE = "starforge_sandbox"
# Not the public internet: reached only where the operator allows (SF_SANDBOX_ALLOW_NETS).
DENIED_NETS = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",  # shared address space: Tailscale, pod networks, some clouds' metadata
    "169.254.0.0/16",  # link-local: the usual cloud metadata service
    "fc00::/7",
    "fe80::/10",
)
NFT_TIMEOUT_S = 10


def wanted(cluster_settings: dict) -> bool:
    """Whether jobs of this cluster that run under run_as get a sandbox."""
    return cluster_settings.get("sandbox", "namespaces") != "none"


def check_setting(cluster_settings: dict) -> None:
    mode = cluster_settings.get("sandbox")
    if mode is not None and mode not in MODES:
        raise ValueError(f"sandbox must be one of {', '.join(MODES)}, not {mode!r}")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool, path=_tool_path()) is None]


def problem() -> str:
    """Why jobs cannot be sandboxed on this host, as a sentence; "" when they can."""
    missing = missing_tools()
    if missing:
        return (
            f"{', '.join(missing)} not found: install Debian's bubblewrap, passt, util-linux "
            "and nftables"
        )
    if os.geteuid() != 0:
        return "the server does not run as root"
    return ""


def runner_config(net_gid: int) -> dict:
    """What the runner needs to build the sandbox (sf.contract.SANDBOX_VAR)."""
    return {
        "net_gid": net_gid,
        "devices": gpu_devices(),
        "software": list(settings.SF_SANDBOX_SOFTWARE),
    }


def gpu_devices() -> list[str]:
    """The GPU device nodes a job gets in its sandbox (CUDA_VISIBLE_DEVICES picks its GPUs
    among them, as it did when jobs saw the host's /dev)."""
    found = []
    for path in sorted(glob.glob(settings.SF_SANDBOX_DEVICES)):
        try:
            if stat.S_ISCHR(os.stat(path).st_mode):
                found.append(path)
        except OSError:
            continue
    return found


def prepare_launch(cluster_name: str) -> dict:
    """Check the tools and apply the firewall rule; the runner's SANDBOX_VAR value. Raises a
    permanent LaunchError with the sentence an operator needs."""
    why = problem()
    if why:
        raise LaunchError(
            f"jobs on {cluster_name} run in a sandbox, which cannot be made here: {why}. "
            'Set the cluster\'s "sandbox" to "none" to run them without one (they then reach '
            "this host's loopback and every other job's processes)",
            permanent=True,
        )
    gid = int(settings.SF_SANDBOX_NET_GID)
    apply_firewall(gid, allowed_nets(), nameservers())
    return runner_config(gid)


def allowed_nets() -> list[str]:
    return [str(ipaddress.ip_network(n, strict=False)) for n in settings.SF_SANDBOX_ALLOW_NETS]


def nameservers(path: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The host's DNS servers (jobs resolve through them: the sandbox sees the same file)."""
    found = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                found.append(str(ipaddress.ip_address(fields[1].split("%")[0])))
            except ValueError:
                continue
    return found


def firewall_script(gid: int, allow: list[str], dns: list[str]) -> str:
    """The nftables table, whole: replacing it is one atomic transaction."""
    rules = ["fib daddr type local reject"]  # this host's own addresses, loopback included
    for server in dns:
        family = "ip6" if ":" in server else "ip"
        rules.append(f"{family} daddr {server} meta l4proto {{ tcp, udp }} th dport 53 accept")
    for net in allow:
        family = "ip6" if ":" in net else "ip"
        rules.append(f"{family} daddr {net} accept")
    for net in DENIED_NETS:
        family = "ip6" if ":" in net else "ip"
        rules.append(f"{family} daddr {net} reject")
    body = "\n".join(f"    {rule}" for rule in rules)
    # Only packets of the group's sockets jump: packets the kernel sends with no socket (a
    # TCP reset, an ICMP error) match no skgid and must pass, or a refused connection of any
    # other process on this host would hang instead of failing at once.
    return (
        f"table inet {TABLE} {{}}\n"
        f"flush table inet {TABLE}\n"
        f"table inet {TABLE} {{\n"
        "  chain output {\n"
        "    type filter hook output priority filter; policy accept;\n"
        f"    meta skgid {gid} jump job_egress\n"
        "  }\n"
        "  chain job_egress {\n"
        f"{body}\n"
        "  }\n"
        "}\n"
    )


def apply_firewall(gid: int, allow: list[str], dns: list[str]) -> None:
    script = firewall_script(gid, allow, dns)
    try:
        done = subprocess.run(
            ["nft", "-f", "-"],
            input=script,
            capture_output=True,
            text=True,
            timeout=NFT_TIMEOUT_S,
            env={"PATH": _tool_path()},
            check=False,
        )
        error = "" if done.returncode == 0 else done.stderr.strip() or "failed"
    except (OSError, subprocess.TimeoutExpired) as exc:
        error = str(exc)
    if error:
        raise LaunchError(
            f"cannot apply the sandbox's firewall rule (nft: {error}); without it a job could "
            "reach this host's own addresses",
            permanent=True,
        )


def _tool_path() -> str:
    return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
