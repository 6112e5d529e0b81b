"""The real node's pilot tests share the bed's node and the pilot image imported into it.

Session-scoped: the image is built (cached) and imported into the node's containerd once for
test_pilot_pod.py and test_vo_pool.py together. What each pod took is gathered in `FIGURES` and
printed when the session's last pilot test is done (docs/pilot.md quotes them)."""

from __future__ import annotations

import json

import pytest

from ce_k8s.real.node import pilotimage
from ce_k8s.real.node.node import NodeState

#: What each pod took, printed at the end (docs/pilot.md quotes them).
FIGURES: dict[str, object] = {}


@pytest.fixture(scope="session")
def node(real_kube) -> NodeState:
    st = real_kube.state()
    assert st is not None and st.real_nodes, "the bed has no real node (RealKube.up(real_nodes=1))"
    return NodeState(**st.real_nodes[0])


@pytest.fixture(scope="session")
def pilot_image(real_kube, node):
    """The pilot archive (built from the HTCondor bed's sid root, cached), imported into the node."""
    from ce_k8s.real.condor.condor import build_root

    root = build_root(progress=lambda m: print(f"condor root: {m}", flush=True))
    image = pilotimage.build(root, progress=lambda m: print(f"pilot image: {m}", flush=True))
    seconds = real_kube.nodes.import_image(image.name, image.archive,
                                           progress=lambda m: print(f"real-kube: {m}", flush=True))
    FIGURES["image"] = {"size_mb": round(image.size / 1e6), "build_s": image.build_seconds, "warm": image.warm,
                        "import_s": round(seconds[node.name], 1)}
    yield image
    print(f"pilot pod figures: {json.dumps(FIGURES)}", flush=True)
