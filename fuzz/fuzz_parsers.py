"""Coverage-guided fuzzing (atheris) of the parsers that read outside text; see docs/security.md.

    pip install atheris            # 3.0.0 has a cp311 manylinux wheel
    python fuzz/fuzz_parsers.py wire_old -atheris_runs=200000
    python fuzz/fuzz_parsers.py protocol -max_total_time=60

Targets: wire_old, wire_json, hook_output, config, transform, args, translate, protocol, k8s.
The contract is the one tests/hardening/test_fuzz_parsers.py checks with hypothesis: every
input ends in a result or the parser's typed error; anything else is a finding (atheris prints
the input and stops). A crash of the C++ ClassAd library shows up as a fatal signal.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from ce_k8s import protocol
    from ce_k8s.condor import args as cargs
    from ce_k8s.condor import wire
    from ce_k8s.condor.config import CondorConfig, ConfigError
    from ce_k8s.condor.transform import MacroSet, Transform, TransformError
    from ce_k8s.hooks.translate import TranslateError, translate_ad_text
    from ce_k8s.pods.builder import build_manifests
    from ce_k8s.pods.errors import PodBuildError
    from ce_k8s.settings import Settings


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def wire_old(data: bytes) -> None:
    try:
        for ad in wire.parse_old_ads(_text(data), "fuzz"):
            wire.evaluate_ad(ad)
            wire.sprint_ad(ad)
    except wire.AdParseError:
        pass


def wire_json(data: bytes) -> None:
    try:
        for ad in wire.parse_json_ads(_text(data), "fuzz"):
            wire.evaluate_ad(ad)
    except wire.AdParseError:
        pass


def hook_output(data: bytes) -> None:
    try:
        wire.parse_hook_output(_text(data))
    except wire.HookOutputError:
        pass


def config(data: bytes) -> None:
    try:
        cfg = CondorConfig.from_text(_text(data), "fuzz.conf")
        for name in cfg.names():
            cfg.get(name)
    except ConfigError:
        pass


def transform(data: bytes) -> None:
    import classad2

    try:
        t = Transform.parse("Fuzz", _text(data))
        ad = classad2.ClassAd()
        ad["Owner"] = "x"
        t.apply(ad, MacroSet(None))
    except TransformError:
        pass


def args(data: bytes) -> None:
    text = _text(data)
    for fn in (cargs.split_v2_raw, cargs.split_submit_args, cargs.parse_submit_env, cargs.parse_env_v2_raw):
        try:
            fn(text)
        except cargs.ArgsError:
            pass


def translate(data: bytes) -> None:
    try:
        out = translate_ad_text("[ Name = \"K8s\"; TargetUniverse = 9 ]", _text(data))
    except TranslateError:
        return
    assert "JobUniverse" in out


def protocol_headers(data: bytes) -> None:
    for parse in (protocol.parse_request_header, protocol.parse_reply_header):
        try:
            parse(data)
        except protocol.ProtocolError:
            pass


SETTINGS = Settings(namespace="pilots", image="pilot:1", spool="/spool")


def k8s(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    ad = {"ClusterId": 1, "ProcId": 0, "Owner": "o", "GlobalJobId": "s#1.0#1", "TransferExecutable": False}
    for name in ("K8sNamespace", "K8sAffinity", "K8sVolumes", "K8sPodPatch", "K8sCpuLimit", "Arguments",
                 "Environment", "K8sImage"):
        if fdp.ConsumeBool():
            ad[name] = fdp.ConsumeUnicodeNoSurrogates(64)
    try:
        build_manifests(ad, SETTINGS)
    except PodBuildError:
        pass


TARGETS = {"wire_old": wire_old, "wire_json": wire_json, "hook_output": hook_output, "config": config,
           "transform": transform, "args": args, "translate": translate, "protocol": protocol_headers, "k8s": k8s}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(TARGETS)}}} [libFuzzer options]")
    target = TARGETS[sys.argv.pop(1)]
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
