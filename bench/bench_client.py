"""What the `kubernetes` client spends before each request, with and without `pin_proxy`.

    python bench/bench_client.py [--requests 20000]

The loaders' refresh hook assigns the host before every request, and the client's host setter
re-reads the proxy environment (ce_k8s/kubeclient.py `pin_proxy`). This times that step alone
(`Configuration.auth_settings`, which runs the hook) on a token kubeconfig, alternating the two
configurations so drift falls on both, and prints CPU µs per request and the pinned/bare ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://api.example.test:6443"}}]
users: [{name: u, user: {token: "t"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def per_request_us(path: str, pinned: bool, requests: int) -> float:
    from kubernetes import client, config

    from ce_k8s.kubeclient import pin_proxy

    conf = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=conf)
    if pinned:
        pin_proxy(conf)
    t0 = time.process_time()
    for _ in range(requests):
        conf.auth_settings()
    return (time.process_time() - t0) / requests * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "kubeconfig")
        Path(path).write_text(KUBECONFIG)
        bare, pinned = [], []
        for _ in range(3):
            bare.append(per_request_us(path, False, args.requests))
            pinned.append(per_request_us(path, True, args.requests))
    b, p = sorted(bare)[1], sorted(pinned)[1]
    print(json.dumps({"environment_variables": len(os.environ), "client_bare_us_per_request": round(b, 1),
                      "client_pinned_us_per_request": round(p, 1), "client_pinned_ratio": round(p / b, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
