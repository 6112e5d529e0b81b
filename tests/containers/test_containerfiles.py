"""The CE and pilot Containerfiles, checked by the rules in containers_lint.py.

References: htcondor-ce.md §1.2 (one port 9619; condor_master with COLLECTOR SCHEDD JOB_ROUTER),
htcondor-ce.md §1.3 (config layout: packaged defaults in /usr/share/condor-ce/config.d, site files in
/etc/condor-ce/config.d), htcondor-ce.md §2.3 (hooks run as the mapped account, hence a root master);
docs/design.md Decision 7 (non-root pilots).
"""

from __future__ import annotations

import re
import tomllib

import pytest
from containers_helpers import REPO
from containers_lint import final_user, healthcheck, lint, parse
from packaging.requirements import Requirement

from ce_k8s.settings import Settings

CE = REPO / "containers" / "ce" / "Containerfile"
PILOT = REPO / "containers" / "pilot" / "Containerfile"


@pytest.fixture(scope="module")
def ce():
    return parse(CE.read_text(), str(CE.relative_to(REPO)))


@pytest.fixture(scope="module")
def pilot():
    return parse(PILOT.read_text(), str(PILOT.relative_to(REPO)))


def test_ce_containerfile_is_clean(ce):
    """Pinned base, no ADD, no secrets, caches cleaned, exec forms, COPY sources exist (the build
    context is the repository root)."""
    assert lint(ce, context=REPO, unprivileged=False) == []


def test_pilot_containerfile_is_clean(pilot):
    """Same rules, and the final USER is numeric and non-root (build context: containers/pilot)."""
    assert lint(pilot, context=PILOT.parent, unprivileged=True) == []


def test_pilot_uid_matches_the_pod_default_run_as_user(pilot):
    """The pod spec's default runAsUser/runAsGroup (CE_K8S_RUN_AS_USER/GROUP) is the image's user,
    so files the image owns (the home directory) are the pilot's own."""
    s = Settings()
    assert final_user(pilot) == f"{s.run_as_user}:{s.run_as_group}"


def test_pilot_has_what_glidein_startup_needs_and_no_container_runtime(pilot):
    """glidein_startup.sh needs bash, curl or wget, tar, gzip, python3 and CA certificates;
    no apptainer/singularity (needs privileges `restricted` PSA forbids)."""
    runs = " ".join(i.args for i in pilot.final.instructions if i.keyword == "RUN")
    for pkg in ("bash", "ca-certificates", "tar", "gzip", "python3", "wget", "curl-minimal"):
        assert re.search(rf"(^|\s){re.escape(pkg)}(\s|$)", runs), f"pilot image lacks {pkg}"
    assert not re.search(r"apptainer|singularity", runs)


def test_ce_runs_condor_master_through_the_ce_startup_in_the_foreground(ce):
    """The image starts what the condor-ce unit starts, with -f so the master stays in front."""
    final = ce.final.instructions
    entry = next(i for i in final if i.keyword == "ENTRYPOINT")
    cmd = next(i for i in final if i.keyword == "CMD")
    assert entry.args == '["/usr/share/condor-ce/condor_ce_startup"]'
    assert cmd.args == '["-f"]'


def test_ce_exposes_only_9619_and_has_a_healthcheck(ce):
    """One port (shared_port, htcondor-ce.md §1.2) and a HEALTHCHECK for runtimes without probes."""
    exposes = [i.args for i in ce.final.instructions if i.keyword == "EXPOSE"]
    assert exposes == ["9619"]
    hc = healthcheck(ce)
    assert hc is not None and "condor_ce_status" in hc.args


def test_ce_pins_htcondor_ce_and_condor_versions_by_arg(ce):
    """Versions come from ARGs (overridable with --build-arg) and every install names one."""
    args = ce.final.args
    for name in ("HTCONDOR_SERIES", "CONDOR_VERSION", "HTCONDOR_CE_VERSION"):
        assert re.fullmatch(r"[0-9][0-9.x]*", args[name]), f"{name} is not a version: {args.get(name)!r}"
    runs = " ".join(i.args for i in ce.final.instructions if i.keyword == "RUN")
    assert '"condor-${CONDOR_VERSION}"' in runs
    assert '"htcondor-ce-${HTCONDOR_CE_VERSION}"' in runs
    assert "htcondor-release-current.el9.noarch.rpm" in runs, "the documented EL9 repository install"


def _installed_config_names(ce) -> list[str]:
    """The file names the image puts into /etc/condor-ce/config.d, in HTCondor's read order."""
    names = []
    for ins in ce.final.instructions:
        words = ins.args.split()
        if ins.keyword == "COPY" and words[-1] == "/etc/condor-ce/config.d/":
            names += [p.name for w in words[:-1] for p in REPO.glob(w)]
        if ins.keyword == "RUN" and "70-ce-k8s-route-" in ins.args:
            names += [f"70-ce-k8s-route-{p.name}" for p in (REPO / "routes").glob("*.conf")]
    return sorted(names)


def test_ce_installs_config_then_routes_then_site_overrides(ce):
    """Our config.d/ files are site files in /etc/condor-ce/config.d (htcondor-ce.md §1.3), read
    after the packaged /usr/share defaults; the shipped routes append to JOB_ROUTER_ROUTE_NAMES,
    which config.d/20-ce-k8s-routing.conf resets, so every route file must sort after every
    config.d file; 99-local.conf sorts last. HTCondor-CE's own router defaults
    (config.d/01-ce-router-defaults.conf) are not shipped twice."""
    names = _installed_config_names(ce)
    config = [n for n in names if not n.startswith("70-ce-k8s-route-")]
    routes = [n for n in names if n.startswith("70-ce-k8s-route-")]
    assert config and routes
    assert len(routes) == len(list((REPO / "routes").glob("*.conf")))
    assert "01-ce-router-defaults.conf" not in names
    assert max(config) < min(routes), "a route file would be read before the config that resets the route list"
    assert max(names) < "99-local.conf"
    resets = [p.name for p in (REPO / "config.d").glob("*.conf")
              if re.search(r"^JOB_ROUTER_ROUTE_NAMES\s*=\s*$", p.read_text(), re.M)]
    assert set(resets) <= set(config)


def test_hook_and_agent_paths_of_the_config_exist_in_the_image(ce):
    """config.d/50-ce-k8s-hooks.conf points the router at CE_K8S_HOOK_DIR and condor_master at
    $(BIN)/ce-k8s: the image must write the launchers there and put ce-k8s in /usr/bin (BIN)."""
    from ce_k8s.condor.config import CondorConfig

    cfg = CondorConfig.load(REPO / "config.d")
    hook_dir = cfg.get("CE_K8S_HOOK_DIR")
    runs = " ".join(i.args for i in ce.final.instructions if i.keyword == "RUN")
    assert f"ce-k8s agent --install-hooks {hook_dir}" in runs
    for hook in ("TRANSLATE_JOB", "UPDATE_JOB_INFO", "JOB_FINALIZE", "JOB_CLEANUP"):
        assert cfg.get(f"CE_K8S_HOOK_{hook}").startswith(hook_dir + "/")
    assert cfg.raw("CE_K8S_AGENT") == "$(BIN)/ce-k8s"
    assert "ln -s /opt/ce-k8s/bin/ce-k8s /usr/bin/ce-k8s" in runs


def test_constraints_pin_every_runtime_dependency_to_an_accepted_version():
    """The CE image installs ce-k8s with containers/ce/constraints.txt: each runtime dependency in
    pyproject.toml must be pinned there (==) to a version its specifier accepts."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (REPO / "containers" / "ce" / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    for dep in project["dependencies"]:
        req = Requirement(dep)
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        assert key in pins, f"{req.name} is a runtime dependency but not pinned in constraints.txt"
        assert req.specifier.contains(pins[key], prereleases=True), f"{req.name}=={pins[key]} violates {req.specifier}"


# --- the lint rules themselves can fail -------------------------------------------------------

BAD = """\
ARG BASE=almalinux
FROM ${BASE}
ARG PILOT_TOKEN=abc
ENV DB_PASSWORD=hunter2
ADD https://example.org/tool.tar.gz /opt/
RUN dnf install python3
RUN curl -s https://example.org/install.sh | sh
COPY does-not-exist.txt /etc/
ENTRYPOINT /bin/run
USER pilot
"""


def test_lint_reports_each_broken_rule(tmp_path):
    problems = lint(parse(BAD, "Bad"), context=tmp_path, unprivileged=True)
    rules = {p.split(": ")[1] for p in problems}
    assert rules == {"pinned-base", "no-secrets", "no-add", "clean-cache", "non-interactive", "no-pipe-to-shell",
                     "copy-source", "exec-form", "non-root"}
    assert any(p.startswith("Bad:4: no-secrets") for p in problems), "line numbers point at the instruction"


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("FROM almalinux:latest\nUSER 1000\n", "pinned-base"),
        ("FROM almalinux:9\nUSER 0:0\n", "non-root"),
        ("FROM almalinux:9\nRUN microdnf -y install tar\nUSER 1000\n", "clean-cache"),
        ("FROM almalinux:9\nHEALTHCHECK CMD curl -f http://localhost/\nUSER 1000\n", "exec-form"),
        ("FROM almalinux:9\nRUN true \\\n", "syntax"),
    ],
)
def test_lint_rule_examples(text, rule):
    try:
        problems = lint(parse(text, "X"), unprivileged=True)
    except ValueError as exc:  # LintError for syntax problems
        problems = [str(exc)]
    assert any(f": {rule}:" in p for p in problems), problems


def test_root_image_must_not_pretend_to_drop_root():
    """For the CE (unprivileged=False) a USER line is itself a mistake: it would break hooks."""
    problems = lint(parse("FROM almalinux:9\nUSER condor\n", "CE"), unprivileged=False)
    assert any(": root-image:" in p for p in problems)
