"""`ce-k8s doctor` says where the CE name and the spool came from (docs/install.md, "Settings the CE
already has"): a value taken from the CE's own knob names that knob and its file and line."""

from __future__ import annotations

from test_doctor import doctor


def test_doctor_shows_the_ce_spool_and_name_it_took(bare_host):
    """Without CE_K8S_SPOOL / CE_K8S_CE_NAME overrides, the CE's SPOOL and SCHEDD_NAME are used."""
    local = bare_host.config_dir / "99-local.conf"
    kept = [ln for ln in local.read_text().splitlines() if not ln.startswith(("CE_K8S_SPOOL", "CE_K8S_CE_NAME"))]
    local.write_text("\n".join(kept) + "\n")
    bare_host.write_local(f"SPOOL = {bare_host.spool}\nFULL_HOSTNAME = ce.example.org\nSCHEDD_NAME = ce-a\n",
                          name="10-the-ce.conf")
    _code, found = doctor(bare_host)
    level, line = found["config"]
    assert "CE name ce-a@ce.example.org (from SCHEDD_NAME (" in line and "10-the-ce.conf:3)" in line
    level, line = found["spool"]
    assert level == "OK", line
    assert f"{bare_host.spool} exists (from SPOOL (" in line and "10-the-ce.conf:1) through CE_K8S_SPOOL (" in line
    assert "40-ce-k8s-settings.conf:" in line


def test_doctor_names_an_explicit_override(bare_host):
    _code, found = doctor(bare_host)
    assert "(from CE_K8S_CE_NAME (" in found["config"][1] and "99-local.conf:1)" in found["config"][1]
    assert "(from CE_K8S_SPOOL (" in found["spool"][1] and "99-local.conf:4)" in found["spool"][1]
