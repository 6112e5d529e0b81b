"""containers/ce/ce_prepare.py: the CE pod's init step (accounts, directory layout, required files).

References: htcondor-ce.md §2.1/§2.3 (pilots are mapped to local Unix accounts, hooks run as
them), htcondor-ce.md §1.3 (spool/log/lock layout of the htcondor-ce RPM), §2 (the signing key in
/etc/condor-ce/passwords.d/POOL and the host certificate must be present).
"""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys

import pytest
from containers_helpers import REPO

SCRIPT = REPO / "containers" / "ce" / "ce_prepare.py"
_spec = importlib.util.spec_from_file_location("ce_prepare", SCRIPT)
prep = importlib.util.module_from_spec(_spec)
sys.modules["ce_prepare"] = prep  # dataclasses look their module up while the class is built
_spec.loader.exec_module(prep)

BASE_PASSWD = ("root:x:0:0:root:/root:/bin/bash\n"
               "condor:x:4716:4716:Owner of HTCondor Daemons:/var/lib/condor:/sbin/nologin\n")
BASE_GROUP = "root:x:0:\ncondor:x:4716:\n"


def test_accounts_file_parses_names_uids_and_optional_gids():
    text = "# site accounts\nosg 5001\n\ncms  5002  6000   # CMS pilots\n"
    assert prep.parse_accounts(text, "acc") == [prep.Account("osg", 5001, 5001), prep.Account("cms", 5002, 6000)]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("osg\n", "acc:1: expected 'name uid [gid]'"),
        ("Osg 5001\n", "acc:1: account name 'Osg'"),
        ("osg 5001\nbad;rm 5002\n", "acc:2: account name 'bad;rm'"),
        ("osg 0\n", "acc:1: uid 0 is outside"),
        ("osg 999\n", "acc:1: uid 999 is outside"),
        ("osg 65534\n", "acc:1: uid 65534"),
        ("osg -5\n", "acc:1: uid '-5' is not"),
        ("osg 5001\nosg 5002\n", "acc:2: account 'osg' already defined on line 1"),
        ("osg 5001\ncms 5001\n", "acc:2: uid 5001 already used on line 1"),
    ],
)
def test_bad_account_lines_are_errors_naming_file_and_line(text, fragment):
    with pytest.raises(prep.PrepareError) as err:
        prep.parse_accounts(text, "acc")
    assert str(err.value).startswith(fragment)


def test_merge_adds_user_and_group_without_login_and_keeps_the_base():
    passwd, group = prep.merge_accounts(BASE_PASSWD, BASE_GROUP, [prep.Account("osg", 5001, 5001)])
    assert passwd.startswith(BASE_PASSWD)
    assert passwd.endswith("osg:x:5001:5001:ce-k8s pilot account:/nonexistent:/sbin/nologin\n")
    assert group == BASE_GROUP + "osg:x:5001:\n"


def test_merge_is_idempotent_and_refuses_to_redefine_image_accounts():
    passwd, group = prep.merge_accounts(BASE_PASSWD, BASE_GROUP, [prep.Account("osg", 5001, 5001)])
    again = prep.merge_accounts(passwd, group, [prep.Account("osg", 5001, 5001)])
    assert again == (passwd, group)
    with pytest.raises(prep.PrepareError, match="exists in the image with uid 4716"):
        prep.merge_accounts(BASE_PASSWD, BASE_GROUP, [prep.Account("condor", 5001, 5001)])
    with pytest.raises(prep.PrepareError, match="belongs to 'osg'"):
        prep.merge_accounts(passwd, group, [prep.Account("cms", 5001, 5001)])


def test_accounts_sharing_a_gid_share_one_group():
    accounts = prep.parse_accounts("osg 5001 7000\ncms 5002 7000\n")
    _passwd, group = prep.merge_accounts(BASE_PASSWD, BASE_GROUP, accounts)
    assert group.count(":7000:") == 1


def test_layout_creates_the_rpm_directories_with_owner_and_mode(tmp_path):
    """Runs as root in the test bed, so ownership is really applied (the init container's job)."""
    uid, gid = 4716, 4716
    made = prep.make_layout(tmp_path, uid, gid)
    assert len(made) == len(prep.LAYOUT)
    for rel, mode in prep.LAYOUT:
        st = (tmp_path / rel).stat()
        assert stat.S_IMODE(st.st_mode) == mode, rel
        if os.geteuid() == 0:
            assert (st.st_uid, st.st_gid) == (uid, gid), rel
    assert stat.S_IMODE((tmp_path / "var/log/condor-ce/user").stat().st_mode) == 0o1777


def test_layout_leaves_spool_contents_alone_and_refuses_symlinks(tmp_path):
    spool = tmp_path / "var/lib/condor-ce/spool"
    spool.mkdir(parents=True)
    job = spool / "job_queue.log"
    job.write_text("queue")
    job.chmod(0o600)
    prep.make_layout(tmp_path, 4716, 4716)
    assert job.read_text() == "queue" and stat.S_IMODE(job.stat().st_mode) == 0o600
    (tmp_path / "run").rename(tmp_path / "elsewhere")
    (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "condor-ce").rmdir()
    (tmp_path / "run" / "condor-ce").symlink_to("/etc")
    with pytest.raises(prep.PrepareError, match="symlink"):
        prep.make_layout(tmp_path, 4716, 4716)


def _etc(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text(BASE_PASSWD)
    (etc / "group").write_text(BASE_GROUP)
    return etc


def test_main_end_to_end_as_the_init_container_runs_it(tmp_path):
    """The command line of containers/k8s/ce/statefulset.yaml's `prepare` container."""
    etc = _etc(tmp_path)
    accounts = tmp_path / "accounts"
    accounts.write_text("osg 5001\n")
    key = tmp_path / "POOL"
    key.write_bytes(os.urandom(64))
    out = tmp_path / "out"
    rc = prep.main([f"--accounts={accounts}", f"--etc-out={out}", f"--base-etc={etc}", "--layout",
                    f"--root={tmp_path / 'root'}", f"--require={key}"])
    assert rc == 0
    assert "osg:x:5001:5001:" in (out / "passwd").read_text()
    assert stat.S_IMODE((out / "passwd").stat().st_mode) == 0o644
    assert (tmp_path / "root/var/lib/condor-ce/spool").is_dir()


def test_missing_or_empty_required_file_fails_before_anything_is_written(tmp_path):
    etc = _etc(tmp_path)
    empty = tmp_path / "hostkey.pem"
    empty.write_text("")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), f"--base-etc={etc}", "--layout", f"--root={tmp_path / 'root'}",
         f"--require={tmp_path / 'POOL'}", f"--require={empty}"],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 2
    assert f"{tmp_path / 'POOL'}: missing (mount it from its Secret" in proc.stderr
    assert f"{empty}: empty" in proc.stderr
    assert not (tmp_path / "root").exists(), "no layout when the CE cannot start anyway"


def test_bad_accounts_file_exits_2_with_file_and_line(tmp_path):
    etc = _etc(tmp_path)
    accounts = tmp_path / "accounts"
    accounts.write_text("osg 5001\nroot 5002\n")
    rc = prep.main([f"--accounts={accounts}", f"--etc-out={tmp_path / 'out'}", f"--base-etc={etc}"])
    assert rc == 2
    assert not (tmp_path / "out").exists()
