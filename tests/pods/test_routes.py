"""Every example pilot through the shipped routes, the real translate hook, and the builder.

This is the path of docs/design.md "The path of one pilot": examples/*.ad (GlideinWMS-shaped, htcondor-ce.md
§6.3) → first matching route → translate hook output → VanillaToGrid + transforms → evaluate_ad → pod.
Every manifest is validated against the Kubernetes OpenAPI schema.
"""

from __future__ import annotations

import pathlib

import kubernetes_validate
import pytest

from ce_k8s.condor import wire
from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.routing import RouterConfig
from ce_k8s.hooks.translate import translate_ad_text
from ce_k8s.pods.builder import build_manifests, redact_secret
from ce_k8s.pods.jobad import JobAd
from ce_k8s.pods.sandbox import sandbox_plan
from ce_k8s.settings import Settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("pilot-*.ad"))


@pytest.fixture(scope="module")
def shipped():
    cfg = CondorConfig.load()
    router = RouterConfig.from_config(cfg)
    assert not router.errors, router.errors
    return router, Settings.from_config(cfg)


def routed_ads(router, path):
    for job in wire.parse_job_ads(path.read_text()):
        route = router.choose_route(job)
        if route is None:
            continue
        translated = wire.parse_hook_output(translate_ad_text(route.route_info_line(), wire.sprint_ad(job)))
        routed = router.route_job(job, route, translated)
        assert not routed.failed, routed.errors
        yield job, route, wire.evaluate_ad(routed.ad)


def test_examples_exist():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_pilot_builds_a_valid_pod(shipped, path):
    """Each example pilot routed by the shipped routes builds a schema-valid pod and Secret."""
    router, settings = shipped
    built_any = False
    for job, route, ad in routed_ads(router, path):
        plan = sandbox_plan(JobAd(ad), settings)
        files = {item.key: b"content of " + item.key.encode() for item in plan}
        built = build_manifests(ad, settings, files)
        kubernetes_validate.validate(built.pod, "1.30", strict=True)
        kubernetes_validate.validate(built.secret, "1.30", strict=True)
        kubernetes_validate.validate(redact_secret(built.secret), "1.30", strict=True)
        dry = build_manifests(ad, settings, None)
        assert dry.pod == built.pod  # the dry run shows exactly the pod the agent creates
        # identity comes from the *source* job (decision 5), labels name the route it took
        assert built.name == ad["K8sPodName"]
        assert built.pod["metadata"]["annotations"]["ce-k8s.htcondor.org/global-job-id"] == job.eval("GlobalJobId")
        assert built.pod["metadata"]["labels"]["ce-k8s.htcondor.org/route"] == route.name
        res = built.pod["spec"]["containers"][0]["resources"]
        whole = bool(ad.get("WantWholeNode"))
        memory = ad["K8sWholeNodeMemory"] if whole else ad["RequestMemory"]
        assert res["requests"]["memory"] == res["limits"]["memory"] == f"{int(memory)}Mi"
        assert res["requests"]["cpu"] == str(ad["K8sWholeNodeCpus"] if whole else ad["RequestCpus"])
        assert built.pod["spec"]["activeDeadlineSeconds"] == ad["BatchRuntime"]
        built_any = True
    assert built_any or "noroute" in path.name
