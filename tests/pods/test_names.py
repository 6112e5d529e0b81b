"""Pod/Secret names and label values (docs/design.md Decision 5, docs/internals.md "Identity")."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from ce_k8s.pods.names import (
    dns_label,
    is_dns_label,
    is_dns_subdomain,
    is_label_value,
    label_value,
    pod_name,
    secret_name,
)

GJID = "ce.example.edu#1234567.3#1760000000"


def test_pod_name_is_readable_and_pinned():
    """Deterministic across runs and Python versions: the value is pinned (SHA-256, not hash())."""
    assert pod_name(GJID, 0) == "ce-1234567-3-a0-6673d95a50"
    assert pod_name(GJID, 1) != pod_name(GJID, 0)
    assert pod_name("ce.example.edu#1234567.3#1760000001", 0) != pod_name(GJID, 0)


def test_pod_name_same_in_a_fresh_interpreter():
    """A new process (new hash seed) computes the same name: decision 5 'stable across runs'."""
    code = f"from ce_k8s.pods.names import pod_name; print(pod_name({GJID!r}, 2))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345"})
    assert out.stdout.strip() == pod_name(GJID, 2)


def test_names_module_is_stdlib_only():
    """The translate hook imports names.py (docs/internals.md): it must not pull in third-party code."""
    code = ("import sys; import ce_k8s.pods.names; "
            "third=('classad2','htcondor','kubernetes','jsonpatch','yaml'); "
            "bad=[m for m in sys.modules if m.split('.')[0] in third]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@given(st.text(max_size=300), st.integers(min_value=0, max_value=999_999))
def test_pod_name_always_a_dns_label(gjid, attempt):
    """Any GlobalJobId gives an RFC 1123 label of at most 63 chars; the Secret name is a subdomain."""
    if not gjid:
        return
    name = pod_name(gjid, attempt)
    assert is_dns_label(name) and len(name) <= 63
    assert is_dns_subdomain(secret_name(name))


def test_label_value_keeps_valid_text_and_hashes_the_rest():
    """Valid values pass unchanged; invalid ones are sanitised, readable, and made distinct by a hash."""
    assert label_value("1234567.3") == "1234567.3"
    assert label_value("Slurm_Cluster") == "Slurm_Cluster"
    assert label_value("") == ""
    changed = label_value("user@example.org")
    assert changed.startswith("user_example.org-") and is_label_value(changed)
    assert label_value("a b") != label_value("a_b")
    long = label_value("x" * 100)
    assert len(long) <= 63 and is_label_value(long)


@given(st.text(max_size=200))
def test_label_value_and_dns_label_always_valid(text):
    """Whatever comes in, the result is a valid label value / DNS label (docs/internals.md Identity)."""
    assert is_label_value(label_value(text))
    assert is_dns_label(dns_label(text))


@given(st.text(max_size=40), st.text(max_size=40))
def test_label_value_distinct_inputs_stay_distinct(a, b):
    """Sanitising never merges two different inputs (hash suffix whenever text changed)."""
    if a != b:
        assert label_value(a) != label_value(b)
