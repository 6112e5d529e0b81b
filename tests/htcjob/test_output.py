"""Output into a ConfigMap: whole when it fits; when not, each file keeps its end and the status
says it was cut. Into a claim: only where the site mounted it."""

from __future__ import annotations

import pytest

from ce_k8s.htcjob.output import OutputError, to_claim, to_configmap


def write(root, proc, name, data: bytes):
    d = root / str(proc)
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def test_small_output_is_whole_and_binary_goes_to_binary_data(tmp_path):
    write(tmp_path, 0, "_condor_stdout", b"hello\n")
    write(tmp_path, 0, "blob", b"\xff\x00")
    out = to_configmap(tmp_path, [0])
    assert out.data == {"0.stdout": "hello\n"} and out.binary == {"0.blob": "/wA="} and not out.truncated


def test_large_output_keeps_each_files_tail_within_the_budget(tmp_path):
    write(tmp_path, 0, "_condor_stdout", b"a" * 500 + b"END0")
    write(tmp_path, 1, "_condor_stdout", b"b" * 900 + b"END1")
    write(tmp_path, 1, "_condor_stderr", b"small")
    out = to_configmap(tmp_path, [0, 1], budget=600)
    assert out.truncated
    assert out.data["1.stderr"] == "small"                      # small files whole
    assert out.data["0.stdout"].endswith("END0") and out.data["1.stdout"].endswith("END1")
    assert sum(len(v) for v in out.data.values()) <= 600


def test_a_claim_must_be_mounted(tmp_path):
    write(tmp_path / "out", 0, "_condor_stdout", b"x")
    with pytest.raises(OutputError, match="not mounted in the operator"):
        to_claim(tmp_path / "out", [0], tmp_path / "claims", "data", "runs", "job")
    (tmp_path / "claims" / "data").mkdir(parents=True)
    dest = to_claim(tmp_path / "out", [0], tmp_path / "claims", "data", "runs", "job")
    assert (dest / "0" / "stdout").read_text() == "x"
