"""CE_K8S_* knobs (docs/internals.md "Settings"; docs/design.md Decision 9)."""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import dataclass

import pytest

from ce_k8s.condor.config import ConfigError
from ce_k8s.settings import Settings, SettingsError

ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclass
class Origin:
    file: str
    line: int


class FakeConfig:
    """The two CondorConfig methods Settings uses, over a dict (values as unexpanded text)."""

    def __init__(self, values: dict[str, str], file: str = "/etc/condor-ce/config.d/99-local.conf") -> None:
        self.values = values
        self.file = file

    def get(self, name, default=None):
        return self.values.get(name, default)

    def origin(self, name):
        return Origin(self.file, list(self.values).index(name) + 1) if name in self.values else None


def test_defaults():
    """Settings() carries the documented defaults (1 MiB Secret, 3 attempts, 4320 min wall time)."""
    s = Settings()
    assert s.secret_max_bytes == 1024 * 1024 and s.max_attempts == 3 and s.default_walltime == 4320
    assert s.run_as_user > 0 and s.cpu_limit == "request" and s.gpu_resource == "nvidia.com/gpu"


def test_from_config_types_and_fallbacks():
    """Knobs parse to their types; CE name falls back to FULL_HOSTNAME, collector to the CE's COLLECTOR_HOST."""
    cfg = FakeConfig({
        "CE_K8S_NAMESPACE": "pilots",
        "CE_K8S_QPS": "12.5",
        "CE_K8S_MAX_ATTEMPTS": "5",
        "CE_K8S_IMAGE_PULL_POLICY": "always",
        "CE_K8S_PILOT_ENV": "\"A=1 B='two words'\"",
        "FULL_HOSTNAME": "ce.example.edu",
        "COLLECTOR_HOST": "ce.example.edu:9619",
        "CE_K8S_CPU_LIMIT": "1.5",
    })
    s = Settings.from_config(cfg)
    assert s.namespace == "pilots" and s.qps == 12.5 and s.max_attempts == 5
    assert s.image_pull_policy == "Always"
    assert s.pilot_env == {"A": "1", "B": "two words"}
    assert s.ce_name == "ce.example.edu" and s.collector_host == "ce.example.edu:9619"
    assert s.cpu_limit == "1.5"


def test_grid_resource_knob():
    """CE_K8S_GRID_RESOURCE (docs/routes.md, "CEs with other backends"): `batch k8s` by default;
    words one space apart; one pair of surrounding quotes dropped, as HTCondor unquotes a route's
    GridResource macro, so `"batch k8s"` does not silently match no route."""
    assert Settings().grid_resource == "batch k8s"
    assert Settings.from_config(FakeConfig({})).grid_resource == "batch k8s"
    cases = {"kubernetes": "kubernetes", '"batch k8s"': "batch k8s", "  batch   K8s  site-b ": "batch K8s site-b"}
    for value, want in cases.items():
        assert Settings.from_config(FakeConfig({"CE_K8S_GRID_RESOURCE": value})).grid_resource == want, value


def test_disable_pilot_ads_drops_the_collector():
    """HTCondor-CE's Env transform: CONDORCE_COLLECTOR_HOST=$(COLLECTOR_HOST) unless DISABLE_PILOT_ADS."""
    s = Settings.from_config(FakeConfig({"COLLECTOR_HOST": "ce:9619", "DISABLE_PILOT_ADS": "True"}))
    assert s.collector_host == "" and s.disable_pilot_ads


@pytest.mark.parametrize(("knob", "value", "fragment"), [
    ("CE_K8S_SECRET_MAX_BYTES", "2000000", "outside 1..1048576"),
    ("CE_K8S_MAX_ATTEMPTS", "three", "not an integer"),
    ("CE_K8S_NAMESPACE", "Bad_NS", "not a valid namespace"),
    ("CE_K8S_QPS", "nan", "outside"),
    ("CE_K8S_IMAGE_PULL_POLICY", "Sometimes", "not one of"),
    ("CE_K8S_SPOOL", "relative/spool", "absolute path"),
    ("CE_K8S_PILOT_ENV", "\"A=1 'B=unterminated\"", "not a valid environment"),
    ("CE_K8S_CPU_LIMIT", "0.5", "factor between 1 and 64"),
    ("DISABLE_PILOT_ADS", "maybe", "not a boolean"),
    ("CE_K8S_RUN_AS_USER", "0", "outside 1.."),
    ("CE_K8S_GRID_RESOURCE", '""', "names no GridResource words"),
    ("CE_K8S_GRID_RESOURCE", "batch \"k8s\"", "must not contain quotes"),
])
def test_bad_knob_names_file_and_line(knob, value, fragment):
    """A bad knob raises SettingsError 'file:line: KNOB: message' (where it was set, via cfg.origin)."""
    cfg = FakeConfig({"CE_K8S_IMAGE": "x", knob: value})
    with pytest.raises(SettingsError) as info:
        Settings.from_config(cfg)
    assert str(info.value).startswith(f"/etc/condor-ce/config.d/99-local.conf:2: {knob}: ")
    assert fragment in str(info.value)
    assert info.value.file == cfg.file and info.value.line == 2
    assert isinstance(info.value, ConfigError) and info.value.knob == knob


def test_shipped_config_file_parses_to_the_defaults():
    """config.d/40-ce-k8s-settings.conf documents exactly the built-in defaults (read alone, without a
    CE whose SPOOL, COLLECTOR_HOST and ROUTED_JOB_MAX_TIME its knobs refer to)."""
    from ce_k8s.condor.config import CondorConfig

    text = (ROOT / "config.d" / "40-ce-k8s-settings.conf").read_text()
    values = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    cfg = CondorConfig.from_text(text + "CE_K8S_CE_NAME = htcondor-ce\n", "40-ce-k8s-settings.conf")
    s = Settings.from_config(cfg)
    # The knobs that refer to a CE value take whatever the reader gives the CE's knob (tests/pods/test_settings_ce.py).
    from_ce = {"spool", "collector_host", "default_walltime"}
    assert dataclasses.replace(s, **{f: getattr(Settings(), f) for f in from_ce}) == Settings()
    documented = {k for k in values if k.startswith("CE_K8S_")}
    internals = (ROOT / "docs" / "internals.md").read_text()
    for knob in ("CE_K8S_NAMESPACE", "CE_K8S_SECRET_MAX_BYTES", "CE_K8S_DEFAULT_WALLTIME", "CE_K8S_INFO_HEADROOM"):
        assert knob in documented and knob in internals


def test_real_condor_config_origin():
    """With the real CondorConfig, the error names the file and the knob's line."""
    from ce_k8s.condor.config import CondorConfig

    cfg = CondorConfig.from_text("# site\nCE_K8S_NAMESPACE = pilots\nCE_K8S_MAX_ATTEMPTS = lots\n", "99-site.conf")
    with pytest.raises(SettingsError) as info:
        Settings.from_config(cfg)
    assert str(info.value) == "99-site.conf:3: CE_K8S_MAX_ATTEMPTS: 'lots' is not an integer"
    good = CondorConfig.from_text("NS = cms\nCE_K8S_NAMESPACE = $(NS)-pilots\nCE_K8S_SECRET_MAX_BYTES = 4096\n")
    s = Settings.from_config(good)
    assert s.namespace == "cms-pilots" and s.secret_max_bytes == 4096
