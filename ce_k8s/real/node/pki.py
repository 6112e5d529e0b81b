"""The bed's certificates for the node side, made with `openssl` (test tool only).

One CA, the *node CA*, signs what crosses between the API server and the kubelets as a cluster
does it: each real kubelet's serving certificate (its loopback IP as the subject alternative name),
the kubelet stub's (it plays the kwok nodes' endpoint on 127.0.0.1), and the API server's client
certificate for kubelets (`--kubelet-client-certificate`, CN `kube-apiserver-kubelet-client`). The
API server verifies kubelets with it (`--kubelet-certificate-authority`), the kubelets verify the
API server's client certificate with it (`authentication.x509.clientCAFile`), and the agent's
direct Summary reads trust it (`CE_K8S_KUBELET_CA`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

APISERVER_KUBELET_CLIENT = "kube-apiserver-kubelet-client"


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def make_ca(directory: Path, name: str = "node-ca") -> tuple[Path, Path]:
    """A self-signed CA (EC P-256, 30 days): (certificate, key)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "30",
             "-subj", f"/CN=ce-k8s-bed-{name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", str(key), "-out", str(cert))
    key.chmod(0o600)
    return cert, key


def issue(ca: tuple[Path, Path], directory: Path, name: str, cn: str, *, ips: tuple[str, ...] = (),
          org: str | None = None, client: bool = False) -> tuple[Path, Path]:
    """A leaf certificate signed by `ca`: for serving on `ips`, or for a client (`client=True`)."""
    cert, key, csr, ext = (directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr",
                           directory / f"{name}.ext")
    subject = f"/CN={cn}" + (f"/O={org}" if org else "")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", subject,
             "-keyout", str(key), "-out", str(csr))
    lines = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
             f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}"]
    if ips:
        lines.append("subjectAltName=" + ",".join(f"IP:{ip}" for ip in ips))
    ext.write_text("\n".join(lines) + "\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-days", "30", "-extfile", str(ext), "-out", str(cert))
    csr.unlink()
    ext.unlink()
    key.chmod(0o600)
    return cert, key
