"""The policy module, every branch: deny by default, and the rule behind every decision."""

from __future__ import annotations

import pytest

from sandbox.policy import (
    Egress,
    Grant,
    Policy,
    Principal,
    Request,
    ResourceClass,
    Risk,
    normalize,
)

SMALL = ResourceClass(cpu_s=1, memory_mb=64)
DEV = Grant(
    tools=frozenset({"run_python", "read_file", "write_file", "list_dir"}),
    read=("*", "src/**"),
    write=("out/*",),
    resources=SMALL,
)
POLICY = Policy(
    by_key={"ci-bot": Grant(tools=frozenset({"read_file"}), read=("*.md",))},
    by_tenant={"acme": DEV, "strict": Grant(tools=frozenset({"run_shell"}), approval=frozenset({Risk.DESTRUCTIVE}))},
)  # fmt: skip
ACME = Principal("acme", "k1")


def test_nothing_is_allowed_without_a_grant():
    d = Policy().decide(ACME, Request("read_file", "a"))
    assert not d.allowed and d.rule == "default" and "no grant" in d.reason
    assert d.risk is Risk.READ_ONLY


def test_unknown_tool_is_refused_before_anything_else():
    d = POLICY.decide(ACME, Request("format_disk"))
    assert (d.allowed, d.rule, d.risk) == (False, "default", None)


def test_key_grant_wins_over_tenant_grant():
    d = POLICY.decide(Principal("acme", "ci-bot"), Request("run_python"))
    assert not d.allowed and d.rule == "key:ci-bot" and "not granted" in d.reason
    assert POLICY.decide(Principal("acme", "ci-bot"), Request("read_file", "README.md")).allowed


def test_granted_tool_gets_its_resource_class():
    d = POLICY.decide(ACME, Request("run_python"))
    assert d.allowed and d.rule == "tenant:acme" and d.resources == SMALL
    assert d.risk is Risk.DESTRUCTIVE


def test_approval_required_for_a_risk_class():
    who = Principal("strict", "k")
    d = POLICY.decide(who, Request("run_shell"))
    assert not d.allowed and "approval" in d.reason
    assert POLICY.decide(who, Request("run_shell", approved=True)).allowed


def test_the_tools_held_for_an_approval_are_declared_before_any_call():
    assert POLICY.held_for_approval(Principal("strict", "k")) == {"run_shell": Risk.DESTRUCTIVE}
    assert POLICY.held_for_approval(ACME) == {}  # a grant that holds nothing
    assert Policy().held_for_approval(ACME) == {}  # no grant: nothing to ask about


@pytest.mark.parametrize(
    ("tool", "path", "allowed"),
    [
        ("read_file", "notes.txt", True),
        ("read_file", "src/pkg/mod.py", True),
        ("list_dir", ".", True),
        ("write_file", "out/result.json", True),
        ("write_file", "notes.txt", False),  # read-only there
        ("write_file", "out/deep/x", True),  # fnmatch's '*' crosses '/': out/* covers subfolders
        ("write_file", "src/a.py", False),
    ],
)
def test_paths_are_matched_per_access(tool, path, allowed):
    d = POLICY.decide(ACME, Request(tool, path))
    assert d.allowed is allowed, d.reason


@pytest.mark.parametrize(
    "path", ["../etc/passwd", "/etc/passwd", "a/../../b", "..", "x\x00y", None]
)
def test_paths_outside_the_workspace_are_refused(path):
    d = POLICY.decide(ACME, Request("read_file", path))
    assert not d.allowed and "not inside the workspace" in d.reason


NET = Grant(
    tools=frozenset({"http_fetch", "sql_query"}),
    egress=Egress(domains=("api.example.com", "*.docs.example.org"), cidrs=("10.1.0.0/16",), ports=(443,)),
    databases=frozenset({"orders"}),
)  # fmt: skip


@pytest.mark.parametrize(
    ("host", "port", "allowed", "says"),
    [
        ("api.example.com", 443, True, "granted"),
        ("API.example.com.", 443, True, "granted"),
        ("v2.docs.example.org", 443, True, "granted"),
        ("docs.example.org.evil.com", 443, False, "allowlist"),
        ("api.example.com", 80, False, "port 80"),
        ("10.1.2.3", 443, True, "granted"),
        ("10.2.0.1", 443, False, "allowlist"),
        ("example.net", 443, False, "allowlist"),
        (None, 443, False, "no host"),
    ],
)
def test_egress(host, port, allowed, says):
    d = Policy(by_tenant={"t": NET}).decide(
        Principal("t", "k"), Request("http_fetch", host=host, port=port)
    )
    assert d.allowed is allowed and says in d.reason
    if allowed:
        assert d.egress == NET.egress


def test_databases():
    p = Policy(by_tenant={"t": NET})
    assert p.decide(Principal("t", "k"), Request("sql_query", database="orders")).allowed
    d = p.decide(Principal("t", "k"), Request("sql_query", database="payroll"))
    assert not d.allowed and "not granted" in d.reason


def test_normalize():
    assert normalize("a/./b/../c") == "a/c"
    assert normalize("./x") == "x"
    assert normalize("../x") is None
    assert normalize("/abs") is None
    assert normalize(None) is None


def test_every_branch_of_the_policy_is_covered(tmp_path):
    """The policy decides what runs: its tests must take every branch (coverage, --branch)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[2]
    data = str(tmp_path / ".coverage")
    env = {"COVERAGE_FILE": data, "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "coverage", "run", "--branch", "--include=sandbox/policy.py",
           "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/sandbox/test_policy.py",
           "-k", "not every_branch"]  # fmt: skip
    subprocess.run(run, cwd=root, env=env, check=True, capture_output=True)
    report = subprocess.run(
        [sys.executable, "-m", "coverage", "report", "--fail-under=100", "-m"],
        cwd=root, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert report.returncode == 0, report.stdout
