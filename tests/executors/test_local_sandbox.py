"""The local executor's sandbox on the server's side (`jobs.executors.sandbox`): the setting,
the firewall table, and a host that cannot make a sandbox refusing the launch."""

import os

import pytest

from jobs.executors import sandbox
from jobs.executors.base import LaunchError
from jobs.executors.local import LocalExecutor


def test_the_setting_takes_namespaces_or_none():
    for good in ({}, {"sandbox": "namespaces"}, {"sandbox": "none"}):
        LocalExecutor.validate_settings(good)
    with pytest.raises(ValueError, match="sandbox must be one of namespaces, none"):
        LocalExecutor.validate_settings({"sandbox": "off"})
    assert sandbox.wanted({}) and not sandbox.wanted({"sandbox": "none"})


def test_the_firewall_confines_only_the_helpers_group():
    script = sandbox.firewall_script(4242, ["10.1.0.0/16"], ["10.255.255.53", "fd00::53"])
    lines = [line.strip() for line in script.splitlines()]
    # Socketless packets (a reset, an ICMP error) match no group and pass.
    assert "meta skgid 4242 jump job_egress" in lines
    egress = lines[lines.index("chain job_egress {") + 1 : -2]
    assert egress[0] == "fib daddr type local reject"  # before any allowance
    assert egress[1:3] == [
        "ip daddr 10.255.255.53 meta l4proto { tcp, udp } th dport 53 accept",
        "ip6 daddr fd00::53 meta l4proto { tcp, udp } th dport 53 accept",
    ]
    assert egress[3] == "ip daddr 10.1.0.0/16 accept"
    assert {f"{'ip6' if ':' in n else 'ip'} daddr {n} reject" for n in sandbox.DENIED_NETS} == set(
        egress[4:]
    )


def test_nameservers_are_read_from_resolv_conf(tmp_path):
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "# x\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\nnameserver bogus\nsearch a\n"
    )
    assert sandbox.nameservers(conf) == ["10.0.0.2", "fe80::1"]
    assert sandbox.nameservers(tmp_path / "missing") == []


def test_a_host_without_the_tools_refuses_the_launch_with_what_to_install(monkeypatch):
    monkeypatch.setattr(sandbox, "TOOLS", ("bwrap", "no-such-sandbox-tool"))
    with pytest.raises(LaunchError, match="no-such-sandbox-tool not found") as refused:
        sandbox.prepare_launch("local")
    assert refused.value.permanent
    assert '"sandbox" to "none"' in str(refused.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="nft needs root")
def test_the_firewall_table_is_written_whole_and_again_without_harm(settings):
    import subprocess

    # The table is the host's: the very rules every sandboxed launch writes, so a job of a
    # test running beside this one is never left unconfined.
    gid = int(settings.SF_SANDBOX_NET_GID)
    for _ in range(2):
        sandbox.apply_firewall(gid, sandbox.allowed_nets(), sandbox.nameservers())
    listed = subprocess.run(
        ["nft", "list", "table", "inet", sandbox.TABLE], capture_output=True, text=True, check=True
    ).stdout
    assert listed.count(f"meta skgid {gid} jump job_egress") == 1
    assert listed.count("fib daddr type local reject") == 1


def test_make_run_says_plainly_whether_local_jobs_are_sandboxed(monkeypatch):
    from io import StringIO

    from jobs.management.commands.runstack import Command
    from jobs.models import Cluster

    def notice(settings: dict, problem: str) -> str:
        monkeypatch.setattr(sandbox, "problem", lambda: problem)
        out = StringIO()
        Command(stdout=out)._sandbox_notice(Cluster(name="local", kind="local", settings=settings))
        return " ".join(out.getvalue().split())

    assert "run sandboxed" in notice({}, "")
    said = notice({}, "bwrap not found: install Debian's bubblewrap")
    assert "cannot be sandboxed here (bwrap not found" in said and "will fail" in said
    assert "run without a sandbox" in notice({"sandbox": "none"}, "")
