"""Which files go into the Secret (docs/design.md Decision 6; docs/hook-protocol.md §2.2; htcondor-ce.md §6.1-6.3)."""

from __future__ import annotations

import pytest
from podads import SPOOL, SPOOL_DIR, routed_pilot

from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.jobad import JobAd
from ce_k8s.pods.sandbox import EXECUTABLE_MODE, FILE_MODE, check_inside_spool, job_spool_dir, sandbox_plan
from ce_k8s.settings import Settings

S = Settings(spool=SPOOL)


def plan(**overrides):
    return sandbox_plan(JobAd(routed_pilot(**overrides)), S)


def test_spool_dir_from_source_job_id():
    """$(SPOOL)/<cluster%10000>/<proc%10000>/cluster<C>.proc<P>.subproc0 of the *source* job (hook-protocol.md §2.2)."""
    assert job_spool_dir(JobAd({"RoutedFromJobId": "1234567.3"}), SPOOL) == SPOOL_DIR
    assert job_spool_dir(JobAd({"ClusterId": 4711, "ProcId": 0}), "/var/lib/condor-ce/spool") == (
        "/var/lib/condor-ce/spool/4711/0/cluster4711.proc0.subproc0"
    )
    with pytest.raises(PodBuildError) as info:
        job_spool_dir(JobAd({"RoutedFromJobId": "../1.2"}), SPOOL)
    assert info.value.code == "missing-job-id"


def test_glideinwms_pilot_plan():
    """Executable (0550), proxy and inputs (0400), in that order; the factory-side ScitokensFile is skipped."""
    items = plan()
    assert [(i.key, i.role, i.mode) for i in items] == [
        ("glidein_startup.sh", "executable", EXECUTABLE_MODE),
        ("x509up_u1234", "x509", FILE_MODE),
        ("idtoken.tok", "input", FILE_MODE),
        ("url_dirs.desc", "input", FILE_MODE),
    ]
    assert items[0].path == f"{SPOOL_DIR}/glidein_startup.sh"


def test_urls_are_left_to_the_pilot():
    """TransferInput URLs (https://, osdf://) are not files: the pilot fetches them."""
    items = plan(TransferInput="https://example.org/a.tgz, osdf:///ospool/x ,local.txt")
    assert [i.key for i in items if i.role == "input"] == ["local.txt"]


def test_transfer_input_files_spelling_is_accepted():
    """The htcondor-ce.md §6.3 composite spells it TransferInputFiles; HTCondor's attribute is TransferInput."""
    items = plan(TransferInput=None, TransferInputFiles=f"{SPOOL_DIR}/OSG.idtoken")
    assert [i.key for i in items if i.role == "input"] == ["OSG.idtoken"]


@pytest.mark.parametrize("overrides", [
    {"TransferInput": "../../4567/4/cluster1234567.proc4.subproc0/x509up"},
    {"TransferInput": "/etc/shadow"},
    {"x509userproxy": f"{SPOOL}/4567/4/cluster1234567.proc4.subproc0/x509up_u1"},
    {"x509userproxy": f"{SPOOL_DIR}/../../4/cluster1234567.proc4.subproc0/x509up_u1"},
    {"Cmd": "/usr/bin/id"},
    {"Iwd": "/home/osg01", "TransferInput": "input.txt"},
])
def test_paths_outside_the_spool_are_refused(overrides):
    """Issue 3: an input path outside the job's spool directory is a hold, checked after normalising '..'."""
    with pytest.raises(PodBuildError) as info:
        plan(**overrides)
    assert info.value.code == "sandbox-path-outside-spool"


def test_iwd_cannot_widen_the_spool():
    """Iwd pointing at another job's spool does not make that job's files ours."""
    other = f"{SPOOL}/4567/4/cluster1234567.proc4.subproc0"
    with pytest.raises(PodBuildError) as info:
        plan(Iwd=other)
    assert info.value.code == "sandbox-path-outside-spool"


def test_copy_to_spool_executable_is_allowed():
    """copy_to_spool puts Cmd at $(SPOOL)/<C%10000>/cluster<C>.ickpt.subproc0 (gen_ckpt_name ICKPT)."""
    ickpt = f"{SPOOL}/4567/cluster1234567.ickpt.subproc0"
    items = plan(Cmd=ickpt)
    assert items[0].path == ickpt and items[0].role == "executable"


def test_transfer_executable_false_keeps_cmd_out():
    """TransferExecutable = false: Cmd lives in the image, nothing to ship."""
    assert all(i.role != "executable" for i in plan(TransferExecutable=False, Cmd="/usr/bin/pilot"))


def test_relative_scitokens_file_is_shipped_as_token():
    """A token file that was spooled (relative to Iwd) goes in with role token."""
    items = plan(ScitokensFile="bearer.token")
    assert [(i.key, i.role) for i in items if i.role == "token"] == [("bearer.token", "token")]


def test_keys_are_valid_and_unique():
    """Secret keys: only [-._a-zA-Z0-9], never starting with `..` (the API server refuses such a
    key, and such a volume item path: tests/real/test_lifecycle.py), unique even when two inputs
    share a base name."""
    items = plan(TransferInput="a/in put.txt,b/in put.txt,b/..x,...,.hidden")
    keys = [i.key for i in items]
    assert len(keys) == len(set(keys))
    assert "in_put.txt" in keys and "in_put.txt-2" in keys and "_.x" in keys and "_.." in keys
    assert ".hidden" in keys and not any(k.startswith("..") for k in keys)


def test_scitokens_file_outside_spool_is_not_shipped():
    """The factory-side ScitokensFile (htcondor-ce.md §6.1) is never transferred: skipped, never read."""
    for value in ("/var/lib/gwms-factory/credential.scitoken", "../other/token"):
        assert all(i.role != "token" for i in plan(ScitokensFile=value))


def test_directories_are_refused():
    """A trailing '/' (directory transfer) is not supported: clear hold instead of a half sandbox."""
    with pytest.raises(PodBuildError) as info:
        plan(TransferInput="dir/")
    assert info.value.code == "sandbox-bad-entry"


def test_missing_cmd():
    with pytest.raises(PodBuildError) as info:
        plan(Cmd=None)
    assert info.value.code == "missing-executable"


def test_check_inside_spool_is_lexical_and_strict():
    """The helper the agent reuses after realpath(): the spool dir itself and siblings are outside."""
    assert check_inside_spool(f"{SPOOL_DIR}/./a//b", SPOOL_DIR, what="x") == f"{SPOOL_DIR}/a/b"
    for bad in (SPOOL_DIR, SPOOL_DIR + "x/file", f"{SPOOL_DIR}/../x", "relative", f"{SPOOL_DIR}/a\x00"):
        with pytest.raises(PodBuildError):
            check_inside_spool(bad, SPOOL_DIR, what="x")
