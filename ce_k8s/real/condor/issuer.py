"""A SciTokens issuer for the real-HTCondor bed with HTCondor-CE's configuration (ce_k8s.real.condor.stockce).

An OSG CE takes pilots from factories that present a SciToken or WLCG token: a JWT signed by the
VO's issuer, which the CE's daemons verify (scitokens-cpp) by fetching the issuer's keys over HTTPS,
then map through HTCondor-CE's mapfile (`SCITOKENS /<issuer>,<subject>/ <user>`). Nothing here
reaches the Internet, so the bed is its own issuer and its own certificate authority:

* a test CA, which the bed puts in the root's system trust store (what HTCondor-CE's
  `mapfiles.d/10-scitokens.conf` says token authentication needs) so that scitokens-cpp trusts the
  issuer's HTTPS and the factory trusts the CE's host certificate;
* the CE's host certificate (SCITOKENS authentication runs inside a TLS handshake, and HTCondor-CE's
  stock certificate paths do not exist in the root);
* an RS256 signing key, published as a JWKS behind `/.well-known/openid-configuration` by
  `serve()`, a small HTTPS server run as its own process (the bed's daemons outlive `up`);
* `mint()`: a WLCG token for the factory, signed with that key.

Keys and certificates come from the `openssl` command (no Python crypto package is a dependency);
the JWT is the standard compact form, header and claims base64url-encoded and RS256 the PKCS#1 v1.5
signature `openssl dgst -sha256 -sign` makes. Test tooling: nothing in the product uses it.

    python -m ce_k8s.real.condor.issuer serve DIR PORT      # what the bed starts
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: The issuer's port on 127.0.0.1 (one bed per machine, as with the collector's 19618).
ISSUER_PORT = 19643
#: WLCG scopes that HTCondor turns into READ and WRITE (compute.create, .modify and .cancel together
#: give WRITE; the translation needs `wlcg.ver`): what a factory needs to submit and manage pilots.
PILOT_SCOPES = "compute.create compute.modify compute.cancel compute.read"
KEY_ID = "ce-k8s-testbed-1"
WELL_KNOWN = "/.well-known/openid-configuration"
JWKS_PATH = "/jwks"


class IssuerError(RuntimeError):
    """The issuer could not be made or started; the message says which step and why."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _san(name: str) -> str:
    """A subjectAltName entry: `IP:` for an address (a pod network's gateway has no name), else `DNS:`."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return f"DNS:{name}"
    return f"IP:{name}"


def _openssl(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> bytes:
    exe = shutil.which("openssl")
    if exe is None:
        raise IssuerError("the SciTokens issuer needs the openssl command (apt-get install openssl)")
    proc = subprocess.run([exe, *args], input=stdin, capture_output=True, cwd=cwd, check=False)
    if proc.returncode != 0:
        raise IssuerError(f"openssl {args[0]} failed: {proc.stderr.decode(errors='replace').strip()[-400:]}")
    return proc.stdout


class TestIssuer:
    """The issuer's files in `directory`: CA, host certificates, signing key, JWKS, pid and log."""

    __test__ = False        # not a pytest class, whatever its name

    def __init__(self, directory: Path | str, port: int = ISSUER_PORT) -> None:
        self.dir = Path(directory)
        self.port = port

    # ------------------------------------------------------------------ names and files
    @property
    def url(self) -> str:
        """The `iss` claim: https, no trailing slash (scitokens-cpp appends the well-known path)."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def pid_file(self) -> Path:
        return self.dir / "issuer.pid"

    def host_cert(self, name: str) -> tuple[Path, Path]:
        """The certificate and key made by `create` for host `name`."""
        return self.dir / f"{name}.crt", self.dir / f"{name}.key"

    # ------------------------------------------------------------------ making it
    def create(self, hosts: dict[str, list[str]]) -> None:
        """A fresh CA, a certificate per entry of `hosts` (name -> DNS names or IP addresses; each
        also gets `IP:127.0.0.1`), the issuer's own certificate and the signing key with its JWKS."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                 "-days", "30", "-subj", "/O=ce-k8s test bed/CN=ce-k8s test bed CA",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 cwd=self.dir)
        for name, dns in {"issuer": ["localhost"], **hosts}.items():
            ext = self.dir / f"{name}.ext"
            ext.write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n"
                           f"subjectAltName={','.join([*(_san(d) for d in dns), 'IP:127.0.0.1'])}\n")
            _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                     "-subj", f"/O=ce-k8s test bed/CN={dns[0]}", cwd=self.dir)
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                     "-out", f"{name}.crt", "-days", "30", "-extfile", ext.name, cwd=self.dir)
        _openssl("genrsa", "-out", "sign.key", "2048", cwd=self.dir)
        modulus = _openssl("rsa", "-in", "sign.key", "-noout", "-modulus", cwd=self.dir).decode().strip()
        n = bytes.fromhex(modulus.split("=", 1)[1])
        jwks = {"keys": [{"kty": "RSA", "alg": "RS256", "use": "sig", "kid": KEY_ID,
                          "n": _b64url(n), "e": _b64url((65537).to_bytes(3, "big"))}]}
        (self.dir / "jwks.json").write_text(json.dumps(jwks))
        (self.dir / "openid-configuration.json").write_text(json.dumps(
            {"issuer": self.url, "jwks_uri": self.url + JWKS_PATH}))
        for key in self.dir.glob("*.key"):
            key.chmod(0o600)
        self.ca_file.chmod(0o644)

    def mint(self, subject: str, audience: str, scopes: str = PILOT_SCOPES, lifetime: int = 86400) -> str:
        """A WLCG token (`wlcg.ver` 1.0) for `subject`, valid for `audience`, signed RS256 by this issuer."""
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "kid": KEY_ID}
        claims = {"iss": self.url, "sub": subject, "aud": audience, "scope": scopes, "wlcg.ver": "1.0",
                  "iat": now - 5, "nbf": now - 5, "exp": now + lifetime, "jti": str(uuid.uuid4())}
        signing_input = ".".join(_b64url(json.dumps(part, separators=(",", ":")).encode())
                                 for part in (header, claims))
        signature = _openssl("dgst", "-sha256", "-sign", str(self.dir / "sign.key"), stdin=signing_input.encode())
        return f"{signing_input}.{_b64url(signature)}"

    # ------------------------------------------------------------------ running it
    def start(self, timeout: float = 20.0, netns_pid: int | None = None) -> int:
        """Serve in a process of its own session (the bed's daemons outlive `up`); wait until the
        discovery document answers over HTTPS verified with the test CA; return its pid.

        With `netns_pid`, in that process's network namespace (a real node's, where the VO pool
        runs), on its loopback; this one cannot reach it there, so it waits for the server's own
        word that its socket listens."""
        log_file = self.dir / "issuer.log"
        log = open(log_file, "ab")
        enter = [] if netns_pid is None else ["nsenter", f"--target={netns_pid}", "--net", "--"]
        proc = subprocess.Popen([*enter, sys.executable, "-m", "ce_k8s.real.condor.issuer", "serve", str(self.dir),
                                 str(self.port)],
                                stdout=log, stderr=log, start_new_session=True)
        log.close()
        self.pid_file.write_text(f"{proc.pid}\n")
        context = ssl.create_default_context(cafile=str(self.ca_file))
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise IssuerError(f"the issuer exited ({proc.returncode}): "
                                  f"{log_file.read_text(errors='replace')[-400:]}")
            if netns_pid is not None:
                if f"serving {self.dir} on" in log_file.read_text(errors="replace"):
                    return proc.pid
                time.sleep(0.1)
                continue
            try:
                with urllib.request.urlopen(self.url + WELL_KNOWN, timeout=2, context=context) as resp:  # noqa: S310
                    if json.loads(resp.read()).get("jwks_uri"):
                        return proc.pid
            except OSError as exc:
                last = str(exc)
            time.sleep(0.1)
        self.stop()
        raise IssuerError(f"the issuer did not answer on {self.url} within {timeout:.0f} s: {last}")

    def stop(self) -> bool:
        """Stop the server `start` left running (by its pid file); True if one was running."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        try:
            os.killpg(pid, 15)
        except ProcessLookupError:
            return False
        finally:
            self.pid_file.unlink(missing_ok=True)
        return True


def serve(directory: Path, port: int) -> None:
    """Answer GET of the discovery document and the JWKS over HTTPS (the issuer's certificate)."""
    documents = {WELL_KNOWN: (directory / "openid-configuration.json").read_bytes(),
                 JWKS_PATH: (directory / "jwks.json").read_bytes()}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = documents.get(self.path.split("?", 1)[0])
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, fmt: str, *args: object) -> None:
            sys.stderr.write(f"issuer: {self.address_string()} {fmt % args}\n")

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(directory / "issuer.crt"), str(directory / "issuer.key"))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    sys.stderr.write(f"issuer: serving {directory} on https://127.0.0.1:{port}\n")
    sys.stderr.flush()
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "serve":
        sys.stderr.write("usage: python -m ce_k8s.real.condor.issuer serve DIR PORT\n")
        return 2
    serve(Path(args[1]), int(args[2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
