#!/usr/bin/env python3
"""HTCondor's own job-transform code as a test oracle (test-only; see tests/condor/ORACLE.md).

The htcondor 25.14.1 wheel ships libcondor_utils, which contains the code condor_job_router runs
to route a job: ``MacroStreamXFormSource`` (a transform or route body), ``XFormHash`` (the macro
set), ``ValidateXForm`` and ``TransformClassAd``. This module drives that code the way
``JobRouter::config``, ``JobRouter::ParseRoute``, ``JobRoute::ParseNext`` and
``JobRoute::ApplyRoutingJobEdits`` (src/condor_job_router/JobRouter.cpp) do, and returns the
routed ad as ClassAd text, so tests can compare ce-k8s's own transform engine with HTCondor's.

How:
- a tiny C++ shim (tests/condor/oracle_shim/xform_shim.cpp, our own declarations of just the
  exported functions we call) is compiled with g++ on first use and cached per wheel version;
- the shim is loaded with ctypes in a *child* Python process that has set the JOB_ROUTER
  subsystem and loaded CONDOR_CONFIG through ``htcondor2.reload_config()``, so the transforms see
  config macros exactly as the router does (``also_in_config``), and a crash, an EXCEPT or a
  broken configuration ends that child, never pytest.

It refuses to run (``OracleUnavailable``) unless the installed wheel is exactly ``PINNED_WHEEL``:
the shim's declarations were checked against that build's exported symbols only.

What it does NOT do (the router does these outside libcondor_utils): hooks, VanillaToGrid, the
umbrella candidate constraint, MaxJobs/MaxIdleJobs accounting, round-robin selection, and the
stamps after the transforms (RoutedFromJobId, RoutedBy, RouteName). Callers give the ad the
transforms should start from (``dest_text``) when they want a pre-step applied.

Command line::

    .venv/bin/python tests/condor/xform_oracle.py --config CONDOR_CONFIG_OR_DIR --jobad FILE [--route NAME] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PINNED_WHEEL = "25.14.1"
SHIM_SOURCE = Path(__file__).resolve().parent / "oracle_shim" / "xform_shim.cpp"
_LIB_PATTERNS = ("libcondor_utils_25_14_1-*.so", "libclassad-*.so.25.14.1")

# XFormHash::Flavor (xform_utils.h): the router's macro set is Basic.
FLAVOR_BASIC = 1
GRID_UNIVERSE = 9
# condor_universe.h numbers, for the "UNIVERSE <name>" line getFormattedText prints.
UNIVERSE_NUMBERS = {
    "standard": 1, "pipe": 2, "linda": 3, "pvm": 4, "vanilla": 5, "pvmd": 6, "scheduler": 7, "mpi": 8,
    "grid": 9, "java": 10, "parallel": 11, "local": 12, "vm": 13,
}


class OracleUnavailable(RuntimeError):
    """The oracle cannot run here (wrong wheel version, no g++, libraries missing)."""


@dataclass
class RouteInfo:
    """What JobRoute::ParseNext learned about one route."""

    name: str
    valid: bool
    error: str = ""
    universe: int = 0
    grid_resource: str | None = None
    requirements: str | None = None
    macros: dict[str, str | None] = field(default_factory=dict)


@dataclass
class OracleResult:
    """The routed ad (ClassAd long form) and what HTCondor's code said on the way."""

    route: str | None = None
    ad_text: str | None = None
    ad_json: str | None = None
    failed: bool = False
    errors: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    routes: list[RouteInfo] = field(default_factory=list)
    route_order: list[str] = field(default_factory=list)
    routing_enabled: bool = True
    notes: list[str] = field(default_factory=list)
    log: str = ""
    config_error_line: int | None = None
    candidate: bool | None = None   # JobRouter::GetCandidateJobs's umbrella constraint, true for the job
    umbrella: str = ""              # that constraint (route/ad are ChooseRoute's, whatever candidate says)

    def ad(self):
        """The routed ad as a classad2.ClassAd (None when the router gave up), read from HTCondor's
        JSON form: the long form leaves newlines in strings raw, which no reader can take back."""
        import classad2

        if self.ad_json is None:
            return None
        ad = classad2.parseOne(self.ad_json, classad2.ParserType.JSON)
        if len(ad) == 0 and self.ad_json.count(":") > 0:
            raise ValueError(f"could not read HTCondor's routed ad back: {self.ad_json[:200]}")
        return ad

    def route_info(self, name: str) -> RouteInfo | None:
        return next((r for r in self.routes if r.name.lower() == name.lower()), None)


# ---- parent side: pin, build, run --------------------------------------------------------------

def installed_wheel_version() -> str | None:
    """The installed htcondor wheel's version (its dist-info), or None."""
    import importlib.metadata

    try:
        return importlib.metadata.version("htcondor")
    except importlib.metadata.PackageNotFoundError:
        return None


def libs_dir() -> Path:
    spec = importlib.util.find_spec("htcondor2")
    if spec is None or spec.origin is None:
        raise OracleUnavailable("htcondor2 is not installed")
    return Path(spec.origin).resolve().parent.parent / "htcondor.libs"


def check_pinned() -> None:
    version = installed_wheel_version()
    if version != PINNED_WHEEL:
        raise OracleUnavailable(
            f"the transform oracle was written against the htcondor {PINNED_WHEEL} wheel's exported symbols; "
            f"installed: {version or 'none'}. Re-check tests/condor/oracle_shim/xform_shim.cpp against the new "
            "wheel (nm -D | c++filt) before changing PINNED_WHEEL")


def _wheel_libs() -> list[Path]:
    libdir = libs_dir()
    libs = []
    for pattern in _LIB_PATTERNS:
        found = sorted(libdir.glob(pattern))
        if len(found) != 1:
            raise OracleUnavailable(f"expected exactly one {pattern} in {libdir}, found {len(found)}")
        libs.append(found[0])
    return libs


def _cache_dir() -> Path:
    base = os.environ.get("CE_K8S_ORACLE_CACHE") or os.path.join(tempfile.gettempdir(),
                                                                  f"ce-k8s-xform-oracle-{os.getuid()}")
    path = Path(base)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def shim_path() -> Path:
    """The compiled shim, built once per (wheel version, shim source, library names)."""
    check_pinned()
    libs = _wheel_libs()
    source = SHIM_SOURCE.read_bytes()
    key = hashlib.sha256(source + "\0".join(lib.name for lib in libs).encode() + PINNED_WHEEL.encode()).hexdigest()
    target = _cache_dir() / f"xform_shim-{PINNED_WHEEL}-{key[:16]}.so"
    if target.is_file():
        return target
    compiler = shutil.which("g++")
    if compiler is None:
        raise OracleUnavailable("g++ is needed to build the transform oracle's shim")
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    cmd = [compiler, "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(tmp), str(SHIM_SOURCE),
           f"-L{libs[0].parent}", *(f"-l:{lib.name}" for lib in libs), f"-Wl,-rpath,{libs[0].parent}",
           "-Wl,--no-undefined"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OracleUnavailable(f"building the oracle shim failed: {' '.join(cmd)}\n{done.stderr}")
    os.replace(tmp, target)
    return target


def _root_config(config: str | os.PathLike[str] | list, workdir: Path) -> Path:
    """A CONDOR_CONFIG for ``config``: a file is used as is; a directory (or a list of them) is
    read as LOCAL_CONFIG_DIR, which is how HTCondor reads a directory of config files."""
    paths = [Path(p) for p in config] if isinstance(config, list | tuple) else [Path(config)]
    if len(paths) == 1 and paths[0].is_file():
        return paths[0].resolve()
    for p in paths:
        if not p.is_dir():
            raise OracleUnavailable(f"{p}: not a configuration file or directory")
    root = workdir / "condor_config"
    root.write_text("LOCAL_CONFIG_DIR = " + ", ".join(str(p.resolve()) for p in paths) + "\n")
    return root


def run_oracle(config, job_text: str, *, route: str | None = None, dest_text: str | None = None,
               bodies: dict | None = None, vanilla_to_grid: bool = False, timeout: float = 120) -> OracleResult:
    """Route ``job_text`` (ClassAd long form, new syntax or JSON) through HTCondor's transform code.

    ``config``: a condor_config file, a directory of config files, or a list of directories.
    ``route``: force this route (else the first route, in JOB_ROUTER_ROUTE_NAMES order, whose
    REQUIREMENTS match the job). ``dest_text``: the ad the transforms start from (the router's
    ``dest_ad`` after hooks and VanillaToGrid); default: the job itself. ``bodies``: instead of
    reading them from the configuration, ``{"pre": [[name, body]...], "route": [name, body],
    "post": [...]}`` (the configuration is still loaded, for the macros transforms can see).
    ``vanilla_to_grid``: before the transforms, apply ce-k8s's own ``vanilla_to_grid`` (VanillaToGrid
    is not in libcondor_utils) to the ad, with the chosen route's universe and GridResource *as
    HTCondor's ParseNext read them*, unless the route's EditJobInPlace is true for the job: the same
    pre-step ``RouterConfig.route_job`` applies, so the two pipelines differ only where the
    transforms, or the reading of the route, differ.
    """
    shim = shim_path()
    with tempfile.TemporaryDirectory(prefix="xform-oracle-") as tmp:
        work = Path(tmp)
        root = _root_config(config, work)
        request = {"shim": str(shim), "job": job_text, "route": route, "dest": dest_text, "bodies": bodies,
                   "vanilla_to_grid": vanilla_to_grid}
        (work / "request.json").write_text(json.dumps(request))
        env = dict(os.environ, CONDOR_CONFIG=str(root))
        env.pop("_CONDOR_SUBSYSTEM", None)
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(work / "request.json"),
                               str(work / "result.json")], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        output = (done.stdout + done.stderr).strip()
        result_file = work / "result.json"
        if not result_file.is_file():
            # config.cpp reports "Configuration Error Line N while reading ..." and exits
            found = re.search(r"Configuration Error Line (\d+)", output)
            return OracleResult(failed=True, routing_enabled=False, log=output,
                                config_error_line=int(found.group(1)) if found else None,
                                errors=[f"HTCondor's code ended the oracle process (exit {done.returncode}): "
                                        f"{output or 'no output'}"])
        data = json.loads(result_file.read_text())
    routes = [RouteInfo(**r) for r in data.pop("routes")]
    return OracleResult(routes=routes, log=output, **data)


def convert_old_routes(entries: str | None = None, defaults: str | None = None, config: str = "",
                       timeout: float = 120) -> list[dict]:
    """HTCondor's own conversion of old-syntax routes (JOB_ROUTER_ENTRIES text, JOB_ROUTER_DEFAULTS
    ad) to transform statements: [{"rval", "name", "statements"}] per route, in order. rval > 0
    is success (ConvertClassadJobRouterRouteToXForm, xform_utils.cpp). ``entries``/``defaults``
    None: read from ``config`` (configuration text) by HTCondor's reader."""
    shim = shim_path()
    with tempfile.TemporaryDirectory(prefix="xform-oracle-") as tmp:
        work = Path(tmp)
        (work / "condor_config").write_text(config)
        (work / "request.json").write_text(json.dumps({"shim": str(shim),
                                                       "convert": {"entries": entries, "defaults": defaults}}))
        env = dict(os.environ, CONDOR_CONFIG=str(work / "condor_config"))
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(work / "request.json"),
                               str(work / "result.json")], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if not (work / "result.json").is_file():
            raise RuntimeError(f"HTCondor's code ended the oracle process (exit {done.returncode}): "
                               f"{(done.stdout + done.stderr).strip()}")
        return json.loads((work / "result.json").read_text())


# ---- comparing with ce-k8s (parent side; imports ce_k8s lazily) ----------------------------------

# JobRouter::FinishSubmitJob writes these after ApplyRoutingJobEdits; they are not transform output.
ROUTER_STAMPS = ("RoutedFromJobId", "RoutedBy", "RouteName", "RoutedToJobId")


def ad_differences(ours, theirs, ignore: tuple[str, ...] = ROUTER_STAMPS) -> list[str]:
    """Attribute-by-attribute differences between two classad2 ads (expressions compared unparsed,
    attribute names compared with their case), as readable lines; [] when they agree."""
    skip = {name.lower() for name in ignore}
    mine = {k.lower(): k for k in ours.keys() if k.lower() not in skip}
    other = {k.lower(): k for k in theirs.keys() if k.lower() not in skip}
    diffs = []
    for key in sorted(set(mine) | set(other)):
        if key not in other:
            diffs.append(f"{mine[key]}: ce-k8s has {ours.lookup(mine[key])}, HTCondor has no such attribute")
        elif key not in mine:
            diffs.append(f"{other[key]}: HTCondor has {theirs.lookup(other[key])}, ce-k8s has no such attribute")
        else:
            a, b = str(ours.lookup(mine[key])), str(theirs.lookup(other[key]))
            if a != b:
                diffs.append(f"{other[key]}: ce-k8s {a}  vs  HTCondor {b}")
            elif mine[key] != other[key]:
                diffs.append(f"{other[key]}: attribute name spelled {mine[key]} by ce-k8s")
    return diffs


def ce_k8s_route_json(config, job_file: Path) -> tuple[int, list[dict]]:
    """``ce-k8s route --json [--config CONFIG] --jobads FILE``, in this process: (exit code, results).
    ``config`` None: the embedded default configuration."""
    import contextlib
    import io

    from ce_k8s.cli import main as ce_k8s_main

    out = io.StringIO()
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = ce_k8s_main(["route", "--json", *(["--config", str(config)] if config is not None else []),
                          "--jobads", str(job_file)])
    text = out.getvalue()
    return int(rc or 0), (json.loads(text) if text.strip() else [])


def json_ad(obj: dict):
    """A routed_ad object of ``ce-k8s route --json`` as a classad2.ClassAd."""
    import classad2

    # classad2 reads expressions only in the escaped "\/Expr(...)\/" spelling; "\/" is "/" in JSON.
    return classad2.parseOne(json.dumps(obj).replace("/", "\\/"), classad2.ParserType.JSON)


def oracle_as_ce_k8s_route(config, job_text: str, ce_config=None,
                           first: OracleResult | None = None) -> tuple[OracleResult, object | None]:
    """HTCondor's transforms with exactly the steps around them that ``ce-k8s route`` applies.

    1. the oracle chooses the route (routes' REQUIREMENTS, JOB_ROUTER_ROUTE_NAMES order);
    2. the translate hook's output for that route (ce-k8s's own hook, from the route description
       ce-k8s computes: a shared pre-step, since hooks are not in libcondor_utils), or the source
       ad unchanged for another backend's route, as ``ce_k8s.condor.trial.route_one`` does;
    3. VanillaToGrid (ce-k8s's, with HTCondor's reading of the route), then HTCondor's pre-route,
       route and post-route transforms;
    4. ``submit_edits`` (ce-k8s's), the schedd's changes on submission.
    ``config`` is what the oracle reads (file, directory or list of directories), ``ce_config``
    the same configuration as ``CondorConfig.load`` takes it (None: the embedded default);
    ``first``: an earlier plain run of the oracle on the same input (saves one run).
    Returns the oracle result of step 3 and the final ad (None when not routed).
    """
    from ce_k8s.condor import wire
    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.condor.routing import RouterConfig, submit_edits
    from ce_k8s.hooks.translate import is_kubernetes_route, translate_ad_text
    from ce_k8s.protocol import DEFAULT_GRID_RESOURCE

    first = first or run_oracle(config, job_text)
    if first.route is None:
        return first, None
    cfg = CondorConfig.load(ce_config)
    router = RouterConfig.from_config(cfg)
    route = next((r for r in router.routes if r.name.lower() == first.route.lower()), None)
    dest_text = job_text
    if route is not None:
        try:
            from ce_k8s.settings import Settings

            knob = Settings.from_config(cfg).grid_resource or DEFAULT_GRID_RESOURCE
        except Exception:  # invalid CE_K8S_* settings: the CLI falls back the same way
            knob = DEFAULT_GRID_RESOURCE
        line = route.route_info_line()
        if is_kubernetes_route(line, knob):
            job = wire.parse_old_ads(_long_form(job_text), "<job>")[0]
            dest_text = translate_ad_text(line, wire.sprint_ad(job))
    second = run_oracle(config, job_text, route=first.route, dest_text=dest_text, vanilla_to_grid=True)
    ad = second.ad()
    if ad is not None:
        submit_edits(ad)
    return second, ad


def differences_from_ce_k8s(config, job_text: str, ce_config=None, workdir: Path | None = None) -> list[str]:
    """Everything in which ``ce-k8s route --json`` disagrees with HTCondor's code for one job: the
    configuration refused (and where), the route chosen, routing given up, the routed ad
    attribute by attribute (router stamps left out). [] when they agree.

    ``config``: the oracle's configuration; ``ce_config``: the same for ``ce-k8s route --config``
    (None: the embedded default). A job ce-k8s finds is no candidate for the router is reported as
    ``["not a candidate: ..."]`` (the oracle cannot judge candidacy).
    """
    from ce_k8s.condor.config import CondorConfig, ConfigError

    first = run_oracle(config, job_text)
    if first.config_error_line is not None:
        try:
            CondorConfig.load(ce_config)
        except ConfigError as exc:
            if exc.line == first.config_error_line:
                return []
            return [f"HTCondor refuses the configuration at line {first.config_error_line}; ce-k8s at {exc}"]
        return [f"HTCondor refuses the configuration ({first.log}); ce-k8s reads it"]
    with tempfile.TemporaryDirectory(prefix="ce-k8s-route-", dir=workdir) as tmp:
        job_file = Path(tmp) / "job.ad"
        job_file.write_text(job_text)
        _rc, results = ce_k8s_route_json(ce_config, job_file)
    if len(results) != 1:
        return [f"ce-k8s route gave {len(results)} results for one job: {results}"]
    ours = results[0]
    ours_candidate = not (ours["route"] is None and any(v.get("check") == "built-in" and v.get("result") is not True
                                                        for v in ours.get("explain") or []))
    if first.candidate is False:
        if ours["route"] is not None:
            return [f"HTCondor's umbrella constraint excludes the job ({first.umbrella}); ce-k8s routes it"]
        return []
    if not ours_candidate:
        return [f"ce-k8s finds the job is no candidate ({ours.get('explain')}); HTCondor's umbrella constraint "
                f"takes it ({first.umbrella})"]
    oracle, oracle_ad = oracle_as_ce_k8s_route(config, job_text, ce_config=ce_config, first=first)
    if ours["route"] != oracle.route:
        return [f"ce-k8s routes the job to {ours['route']!r}, HTCondor to {oracle.route!r} "
                f"({oracle.notes + oracle.errors})"]
    if oracle.route is None:
        return []
    if ours.get("edited_in_place") is not None and oracle_ad is not None:
        # EditJobInPlace: the router edits the source job and submits nothing (FinishSubmitJob), so
        # `route --json` has no routed ad, and the edited ad is HTCondor's without submit_job's edits
        if ours["routed_ad"] is not None:
            return ["the job is edited in place, yet ce-k8s route --json also shows a routed_ad"]
        return ad_differences(json_ad(ours["edited_in_place"]), oracle.ad())
    if oracle_ad is None:
        problems = []
        if not ours.get("errors"):
            problems.append(f"HTCondor gives up on the job ({oracle.errors}); ce-k8s reports no error")
        if ours["routed_ad"]:
            problems.append(f"HTCondor gives up on the job ({oracle.errors}) and submits nothing; ce-k8s route "
                            f"--json still shows a routed_ad (errors: {ours.get('errors')})")
        return problems
    if not ours["routed_ad"]:
        return [f"ce-k8s gives no routed ad ({ours.get('errors')}); HTCondor routes it"]
    return ad_differences(json_ad(ours["routed_ad"]), oracle_ad)


# ---- child side: HTCondor's code in this process -----------------------------------------------

class _Shim:
    """ctypes bindings of xform_shim.cpp."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        vp, cp, ip = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        sigs = {
            "xo_free": (None, [vp]),
            "xo_param_unexpanded": (cp, [cp]),
            "xo_param": (vp, [cp]),
            "xo_expand_param": (vp, [cp]),
            "xo_unique_items": (vp, [cp]),
            "xo_ad_from_long_form": (vp, [cp]),
            "xo_ad_print": (vp, [vp]),
            "xo_ad_print_json": (vp, [vp]),
            "xo_xform_new": (vp, [cp]),
            "xo_xform_open": (ip, [vp, cp, ctypes.POINTER(vp)]),
            "xo_xform_matches": (ip, [vp, vp]),
            "xo_xform_set_universe": (ip, [vp, cp]),
            "xo_xform_text": (vp, [vp]),
            "xo_mset_new": (vp, [ip, ip]),
            "xo_mset_push_source": (ip, [vp, cp]),
            "xo_mset_take_error": (vp, [vp]),
            "xo_mset_optimize": (None, [vp]),
            "xo_validate": (ip, [vp, vp, ctypes.POINTER(vp)]),
            "xo_transform": (ip, [vp, vp, vp, ctypes.c_uint, ctypes.POINTER(vp)]),
            "xo_local_param": (vp, [vp, cp, ctypes.POINTER(ip)]),
            "xo_local_param_unquoted": (vp, [vp, cp, ctypes.POINTER(ip)]),
            "xo_local_param_int": (ip, [vp, cp, ip]),
            "xo_convert_old_route": (vp, [cp, ctypes.POINTER(ip), cp, cp]),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self.lib = lib

    def take(self, ptr: int | None) -> str | None:
        """A malloc'd C string as str (None for NULL), freed."""
        if not ptr:
            return None
        value = ctypes.cast(ptr, ctypes.c_char_p).value
        self.lib.xo_free(ptr)
        return value.decode("utf-8", "surrogateescape") if value is not None else None

    def unexpanded(self, name: str) -> str | None:
        raw = self.lib.xo_param_unexpanded(name.encode())
        return None if raw is None else raw.decode("utf-8", "surrogateescape")

    def param(self, name: str) -> str | None:
        return self.take(self.lib.xo_param(name.encode()))

    def unique_items(self, knob: str) -> list[str]:
        return [item for item in (self.take(self.lib.xo_unique_items(knob.encode())) or "").split("\n") if item]

    def new_xform(self, name: str, text: str) -> tuple[int, int, str]:
        xfm = self.lib.xo_xform_new(name.encode())
        err = ctypes.c_void_p()
        rval = self.lib.xo_xform_open(xfm, text.encode("utf-8", "surrogateescape"), ctypes.byref(err))
        return xfm, rval, self.take(err.value) or ""

    def transform(self, ad: int, xfm: int, mset: int) -> tuple[int, str]:
        err = ctypes.c_void_p()
        rval = self.lib.xo_transform(ad, xfm, mset, 0, ctypes.byref(err))
        return rval, self.take(err.value) or ""

    def local_param(self, mset: int, name: str, unquoted: bool = False) -> str | None:
        exists = ctypes.c_int()
        fn = self.lib.xo_local_param_unquoted if unquoted else self.lib.xo_local_param
        value = self.take(fn(mset, name.encode(), ctypes.byref(exists)))
        return value if exists.value else None


def _long_form(text: str) -> str:
    """One job ad in the long form HTCondor's initAdFromString reads (other forms via classad2)."""
    ads = split_job_ads(text)
    if not ads:
        raise ValueError("no job ad in the input")
    return ads[0]


def split_job_ads(text: str) -> list[str]:
    """The job ads of a file, one text each: a JSON or new-ClassAd list, or long-form ads
    separated by blank lines (condor_q -long); comment lines dropped."""
    stripped = text.strip()
    if stripped.startswith("{") or re.match(r"\[\s*[{\]]", stripped):
        import classad2

        data = json.loads(stripped)
        # condor_q -json writes "\/Expr(...)\/"; json.loads made that "/Expr(...)/", which classad2
        # reads as an expression only when the slashes are escaped again.
        return [classad2.parseOne(json.dumps(obj).replace("/", "\\/"), classad2.ParserType.JSON).printOld()
                for obj in (data if isinstance(data, list) else [data])]
    if stripped.startswith("["):
        import classad2

        return [ad.printOld() for ad in classad2.parseAds(stripped, classad2.ParserType.New)]
    blocks, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("#"):
            continue
        if line.strip():
            current.append(line)
        elif current:
            blocks.append("\n".join(current) + "\n")
            current = []
    return blocks


_NAME_SPLIT = re.compile(r"[,\s]+")


def _route_header(text: str) -> tuple[int, str | None]:
    """(universe, requirements) from getFormattedText's NAME/UNIVERSE/REQUIREMENTS header lines."""
    universe, requirements = 0, None
    for line in text.split("\n")[:3]:
        word, _, rest = line.partition(" ")
        if word == "UNIVERSE":
            universe = UNIVERSE_NUMBERS.get(rest.strip().lower(), 0) or (int(rest) if rest.strip().isdigit() else 0)
        elif word == "REQUIREMENTS":
            requirements = rest
    return universe, requirements


def _parse_routes(shim: _Shim, result: dict, bodies: dict | None) -> tuple[dict[str, tuple[int, RouteInfo]], list]:
    """JobRouter::config's route loop + ParseRoute + JobRoute::ParseNext."""
    allow_empty = shim.param("JOB_ROUTER_SOURCE_JOB_CONSTRAINT") is not None
    if bodies is not None:
        entries = [tuple(bodies["route"])] if bodies.get("route") else []
        order_names = [name for name, _ in entries]
    else:
        names_value = shim.param("JOB_ROUTER_ROUTE_NAMES")
        if names_value is None:
            result["routing_enabled"] = False
            result["notes"].append("JOB_ROUTER_ROUTE_NAMES is not defined, so job routing will not take place")
            return {}, []
        order_names = [n for n in _NAME_SPLIT.split(names_value) if n]
        entries = []
        for name in order_names:
            if name.lower() == "names":
                continue
            text = shim.unexpanded("JOB_ROUTER_ROUTE_" + name)
            if text is None:
                result["notes"].append(f"JOB_ROUTER_ROUTE_{name} is not defined")
                continue
            entries.append((name, text))
    table: dict[str, tuple[int, RouteInfo]] = {}
    for name, raw in entries:
        text = raw.lstrip()
        if not text:
            result["notes"].append(f"JOB_ROUTER_ROUTE_{name} definition is empty, ignoring")
            continue
        if text.startswith("[") or text.startswith("/*"):
            text = shim.take(shim.lib.xo_expand_param(text.encode())) or ""
        body = text.lstrip()
        if len(body) <= 1:
            continue
        xfm, rval, err = shim.new_xform(name, body)
        if rval < 0:
            result["routes"].append(RouteInfo(name, False, err).__dict__)
            continue
        vset = shim.lib.xo_mset_new(FLAVOR_BASIC, 1)
        verr = ctypes.c_void_p()
        if not shim.lib.xo_validate(xfm, vset, ctypes.byref(verr)):
            why = "route is not valid: " + (shim.take(verr.value) or "")
            result["routes"].append(RouteInfo(name, False, why).__dict__)
            continue
        shim.take(verr.value)
        universe, requirements = _route_header(shim.take(shim.lib.xo_xform_text(xfm)) or "")
        if not universe:
            universe = shim.lib.xo_local_param_int(vset, b"TargetUniverse", GRID_UNIVERSE)
            shim.lib.xo_xform_set_universe(xfm, str(universe).encode())
        info = RouteInfo(name, True, universe=universe, requirements=requirements)
        if universe == GRID_UNIVERSE:
            info.grid_resource = shim.local_param(vset, "GridResource", unquoted=True)
        for macro in ("EditJobInPlace", "JobShouldBeSandboxed", "JobFailureTest", "UseSharedX509UserProxy",
                      "SharedX509UserProxy", "SendIDTokens", "MaxJobs", "MaxIdleJobs", "FailureRateThreshold"):
            info.macros[macro] = shim.local_param(vset, macro)
        if requirements is None and not allow_empty:
            info.valid, info.error = False, "JobRouter CONFIGURATION ERROR: Missing Requirements in job route"
            result["routes"].append(info.__dict__)
            continue
        result["routes"].append(info.__dict__)
        table[name.lower()] = (xfm, info)
    order = [table[n.lower()] for n in order_names if n.lower() in table]
    return table, order


def _load_transforms(shim: _Shim, result: dict, knob: str, given: list | None) -> list[tuple[str, int]]:
    """JobRouter::config: JOB_ROUTER_TRANSFORM_<tag> for each tag; any failure disables routing."""
    pairs = given if given is not None else [(tag, shim.unexpanded("JOB_ROUTER_TRANSFORM_" + tag))
                                             for tag in shim.unique_items(knob)]
    loaded = []
    for tag, text in pairs:
        if text is None:
            result["routing_enabled"] = False
            result["notes"].append(f"ERROR: JOB_ROUTER_TRANSFORM_{tag} not found")
            continue
        xfm, rval, err = shim.new_xform(tag, text)
        if rval < 0:
            result["routing_enabled"] = False
            result["notes"].append(f"JOB_ROUTER_TRANSFORM_{tag} load error: {err}")
            continue
        loaded.append((tag, xfm))
    return loaded


def _apply(shim: _Shim, result: dict, ad: int, route_name: str, route_xfm: int,
           pre: list[tuple[str, int]], post: list[tuple[str, int]]) -> bool:
    """JobRoute::ApplyRoutingJobEdits: one Basic XFormHash shared by pre-route, route, post-route."""
    mset = shim.lib.xo_mset_new(FLAVOR_BASIC, 0)
    if not shim.lib.xo_mset_push_source(mset, route_name.encode()):
        result["notes"].append("could not locate the macro set's source list; route name not added to it")

    def step(kind: str, name: str, xfm: int, check: bool) -> bool:
        if check and not shim.lib.xo_xform_matches(xfm, ad):
            return True
        rval, err = shim.transform(ad, xfm, mset)
        macro_error = shim.take(shim.lib.xo_mset_take_error(mset))
        if macro_error:
            result["errors"].append(f"ERROR in {'route' if kind == 'route' else 'transform'} {name} : {macro_error}")
        result["applied"].append(f"{kind} {name}")
        if rval < 0:
            if kind == "route":
                result["errors"].append(f"JobRouter failure (route={name}): {err}.")
            else:
                result["errors"].append(f"JobRouter failure in {kind} transform {name}: {err}.")
            return False
        return True

    for tag, xfm in pre:
        if not step("pre-route", tag, xfm, True):
            return False
    if pre:
        shim.lib.xo_mset_optimize(mset)
    if not step("route", route_name, route_xfm, False):
        return False
    return all(step("post-route", tag, xfm, True) for tag, xfm in post)


def _job_bool(expr_text: str | None, job) -> bool:
    """A route macro such as EditJobInPlace, evaluated against the job (absent: false)."""
    import classad2

    if not expr_text:
        return False
    try:
        value = classad2.ExprTree(expr_text).eval(job)
    except (ValueError, TypeError):
        return False
    return value is True or (isinstance(value, int | float) and not isinstance(value, bool) and value != 0)


def _ce_k8s_vanilla_to_grid(text: str, info: RouteInfo) -> str:
    """The shared pre-step: ce-k8s's VanillaToGrid with HTCondor's reading of the route."""
    import classad2

    from ce_k8s.condor.routing import vanilla_to_grid

    ad = classad2.parseOne(_long_form(text), classad2.ParserType.Old)
    if not _job_bool(info.macros.get("EditJobInPlace"), ad):
        sandboxed = _job_bool(info.macros.get("JobShouldBeSandboxed"), ad)
        vanilla_to_grid(ad, info.universe, info.grid_resource or None, sandboxed)
    return ad.printOld()


def _convert_old(shim: _Shim, entries: str | None, defaults: str | None) -> list[dict]:
    """Every "[ ... ]" route of ``entries`` through ConvertClassadJobRouterRouteToXForm; None:
    the configuration's JOB_ROUTER_ENTRIES / JOB_ROUTER_DEFAULTS, read with param() as the 23.x
    router read them (comment lines inside a multi-line value are gone by then)."""
    if entries is None:
        entries = shim.param("JOB_ROUTER_ENTRIES") or ""
    if defaults is None:
        defaults = shim.param("JOB_ROUTER_DEFAULTS") or "[]"
    out = []
    offset = ctypes.c_int(0)
    data = entries.encode("utf-8", "surrogateescape")
    while offset.value < len(data) and data[offset.value:].strip():
        before = offset.value
        text = shim.take(shim.lib.xo_convert_old_route(data, ctypes.byref(offset), defaults.encode(), b""))
        if text is None:
            out.append({"rval": -1, "name": "", "statements": "the defaults ad does not parse"})
            break
        rval, name, statements = [*text.split("\n", 2), "", ""][:3]
        out.append({"rval": int(rval), "name": name, "statements": statements})
        if int(rval) <= 0 or offset.value <= before:
            break
    return out


def _umbrella_constraint(shim: _Shim, routes: list[RouteInfo]) -> str:
    """JobRouter::GetCandidateJobs's umbrella constraint, built from the same pieces: the source
    constraint, each distinct route REQUIREMENTS (routing-table order: names compared without
    case; none means True), the built-in terms. The router runs as root on a CE, so the clause
    that limits a non-root router to its own user's jobs is not added."""
    source = shim.param("JOB_ROUTER_SOURCE_JOB_CONSTRAINT")
    router_name = shim.param("JOB_ROUTER_NAME") or "jobrouter"
    seen: list[str] = []
    for info in sorted(routes, key=lambda r: r.name.lower()):
        text = info.requirements or "True"
        if text not in seen:
            seen.append(text)
    if not seen:
        return ""
    umbrella = f"({source}) && " if source else ""
    umbrella += "( " + " || ".join(f"({text})" for text in seen) + " )"
    umbrella += (' && (target.ProcId >= 0 && target.JobStatus == 1 && (target.StageInStart is undefined || '
                 'target.StageInFinish isnt undefined) && target.Managed isnt "ScheddDone" && target.Managed isnt '
                 f'"External" && target.Owner isnt Undefined && target.RoutedBy isnt "{router_name}")')
    return umbrella


def _is_candidate(umbrella: str, job_text: str) -> bool:
    """LocalCollectionQuery::Query: the umbrella as the Requirements of a query ad, matched
    against the job (MatchClassAd's rightMatchesLeft, job as TARGET and alternate scope)."""
    import classad2

    if not umbrella:
        return False
    query = classad2.ClassAd()
    query["Requirements"] = classad2.ExprTree(umbrella)
    job = classad2.parseOne(_long_form(job_text), classad2.ParserType.Old)
    return bool(job.matches(query))


def _child(request_file: str, result_file: str) -> int:
    request = json.loads(Path(request_file).read_text())
    import htcondor2

    htcondor2.set_subsystem("JOB_ROUTER")
    htcondor2.reload_config()
    shim = _Shim(request["shim"])
    if "convert" in request:
        Path(result_file).write_text(json.dumps(_convert_old(shim, **request["convert"])))
        return 0
    result: dict = {"route": None, "ad_text": None, "ad_json": None, "failed": False, "errors": [], "applied": [],
                    "routes": [], "route_order": [], "routing_enabled": True, "notes": [], "candidate": None,
                    "umbrella": ""}
    bodies = request.get("bodies")
    given_pre = None if bodies is None else bodies.get("pre", [])
    given_post = None if bodies is None else bodies.get("post", [])
    pre = _load_transforms(shim, result, "JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES", given_pre)
    post = _load_transforms(shim, result, "JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES", given_post)
    table, order = _parse_routes(shim, result, bodies)
    result["route_order"] = [info.name for _, info in order]
    src = shim.lib.xo_ad_from_long_form(_long_form(request["job"]).encode("utf-8", "surrogateescape"))
    dest_text = request.get("dest")
    dest = src if dest_text is None else shim.lib.xo_ad_from_long_form(
        _long_form(dest_text).encode("utf-8", "surrogateescape"))
    if not src or not dest:
        result["failed"] = True
        result["errors"].append("HTCondor could not parse the job ad")
    elif not result["routing_enabled"]:
        result["failed"] = True
    else:
        result["umbrella"] = _umbrella_constraint(shim, [info for _, info in table.values()])
        result["candidate"] = _is_candidate(result["umbrella"], request["job"])
        chosen = None
        if request.get("route"):
            chosen = table.get(request["route"].lower())
            if chosen is None:
                result["errors"].append(f"no valid route named {request['route']}")
        else:
            # ChooseRoute alone; whether the router would look at the job at all is "candidate"
            chosen = next(((x, i) for x, i in order if shim.lib.xo_xform_matches(x, src)), None)
        if not result["candidate"]:
            result["notes"].append("not a candidate: the router's umbrella constraint is not true for the job, "
                                   "so it never reaches route selection (route shows what ChooseRoute would pick)")
        if chosen is None:
            result["failed"] = True
        else:
            xfm, info = chosen
            result["route"] = info.name
            if request.get("vanilla_to_grid"):
                base = request["job"] if dest_text is None else dest_text
                dest = shim.lib.xo_ad_from_long_form(_ce_k8s_vanilla_to_grid(base, info).encode(
                    "utf-8", "surrogateescape"))
            if _apply(shim, result, dest, info.name, xfm, pre, post):
                result["ad_text"] = shim.take(shim.lib.xo_ad_print(dest))
                result["ad_json"] = shim.take(shim.lib.xo_ad_print_json(dest))
            else:
                result["failed"] = True
    Path(result_file).write_text(json.dumps(result))
    return 0


# ---- command line ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1], argv[2])
    parser = argparse.ArgumentParser(description="Route a job ad with HTCondor 25.14.1's own transform code.")
    parser.add_argument("--config", required=True, action="append",
                        help="condor_config file or directory of config files (repeat for several directories)")
    parser.add_argument("--jobad", required=True, help="job ad file (condor_q -long, new ClassAd or JSON)")
    parser.add_argument("--route", help="force this route instead of the first whose REQUIREMENTS match")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = parser.parse_args(argv)
    config = args.config[0] if len(args.config) == 1 else args.config
    jobs = split_job_ads(Path(args.jobad).read_text())
    try:
        results = [run_oracle(config, job, route=args.route) for job in jobs]
    except OracleUnavailable as exc:
        print(f"xform_oracle: {exc}", file=sys.stderr)
        return 2
    if args.json:
        payloads = [dict(r.__dict__, routes=[info.__dict__ for info in r.routes]) for r in results]
        print(json.dumps(payloads[0] if len(payloads) == 1 else payloads, indent=2))
    else:
        for index, result in enumerate(results):
            if len(results) > 1:
                print(f"{'' if index == 0 else chr(10)}# job {index + 1} of {len(results)}")
            for note in result.notes:
                print(f"# note: {note}")
            for err in result.errors:
                print(f"# error: {err}")
            print(f"# route: {result.route or '(none)'}  applied: {', '.join(result.applied) or '(nothing)'}")
            if result.ad_text is not None:
                print(result.ad_text, end="" if result.ad_text.endswith("\n") else "\n")
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
