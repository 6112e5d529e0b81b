"""The bed's SciTokens issuer (ce_k8s.real.condor.issuer), without daemons: its certificates chain to its CA
with the names HTCondor checks, its tokens carry the claims scitokens-cpp and HTCondor require and
verify against the key it publishes, and its discovery answers over HTTPS trusted through that CA."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest

from ce_k8s.real.condor.issuer import JWKS_PATH, PILOT_SCOPES, WELL_KNOWN, TestIssuer


def _part(token: str, i: int) -> bytes:
    piece = token.split(".")[i]
    return base64.urlsafe_b64decode(piece + "=" * (-len(piece) % 4))


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    made = TestIssuer(tmp_path_factory.mktemp("issuer"), port=0)
    made.create({"ce": ["vm", "localhost"]})
    return made


def test_host_certificates_chain_to_the_ca_with_the_names_htcondor_checks(issuer):
    cert, key = issuer.host_cert("ce")
    subprocess.run(["openssl", "verify", "-CAfile", str(issuer.ca_file), str(cert)], check=True, capture_output=True)
    text = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-ext", "subjectAltName"],
                          check=True, capture_output=True, text=True).stdout
    assert "DNS:vm" in text and "DNS:localhost" in text and "IP Address:127.0.0.1" in text
    assert oct(key.stat().st_mode & 0o777) == "0o600"


def test_a_token_has_the_wlcg_claims_and_verifies_with_the_published_key(issuer, tmp_path):
    token = issuer.mint("factory-pilots", "vm:9619")
    header, claims = json.loads(_part(token, 0)), json.loads(_part(token, 1))
    assert header == {"alg": "RS256", "typ": "JWT", "kid": "ce-k8s-testbed-1"}
    assert claims["iss"] == issuer.url and not claims["iss"].endswith("/") and claims["iss"].startswith("https://")
    assert claims["sub"] == "factory-pilots" and claims["aud"] == "vm:9619" and claims["wlcg.ver"] == "1.0"
    assert claims["scope"] == PILOT_SCOPES and claims["nbf"] <= claims["iat"] < claims["exp"]
    # the signature against the JWKS's modulus, rebuilt as a public key by openssl
    jwk = json.loads((issuer.dir / "jwks.json").read_text())["keys"][0]
    n = int.from_bytes(_part("x." + jwk["n"], 1), "big")
    modulus = subprocess.run(["openssl", "rsa", "-in", str(issuer.dir / "sign.key"), "-noout", "-modulus"],
                             check=True, capture_output=True, text=True).stdout.strip().split("=")[1]
    assert n == int(modulus, 16) and jwk["e"] == "AQAB"
    pub = tmp_path / "pub.pem"
    subprocess.run(["openssl", "rsa", "-in", str(issuer.dir / "sign.key"), "-pubout", "-out", str(pub)],
                   check=True, capture_output=True)
    (tmp_path / "sig").write_bytes(_part(token, 2))
    (tmp_path / "data").write_text(token.rsplit(".", 1)[0])
    ok = subprocess.run(["openssl", "dgst", "-sha256", "-verify", str(pub), "-signature", str(tmp_path / "sig"),
                         str(tmp_path / "data")], capture_output=True, text=True)
    assert ok.returncode == 0 and "Verified OK" in ok.stdout
    (tmp_path / "data").write_text(token.rsplit(".", 1)[0] + "x")        # and it can fail
    assert subprocess.run(["openssl", "dgst", "-sha256", "-verify", str(pub), "-signature", str(tmp_path / "sig"),
                           str(tmp_path / "data")], capture_output=True).returncode != 0


def test_discovery_answers_over_https_trusted_through_the_ca(issuer):
    import socket

    with socket.socket() as s:       # a free port for this run
        s.bind(("127.0.0.1", 0))
        issuer.port = s.getsockname()[1]
    (issuer.dir / "openid-configuration.json").write_text(json.dumps({"issuer": issuer.url,
                                                                        "jwks_uri": issuer.url + JWKS_PATH}))
    pid = issuer.start()
    try:
        context = ssl.create_default_context(cafile=str(issuer.ca_file))
        with urllib.request.urlopen(issuer.url + WELL_KNOWN, context=context, timeout=5) as resp:
            assert json.loads(resp.read())["jwks_uri"] == issuer.url + JWKS_PATH
        with urllib.request.urlopen(issuer.url + JWKS_PATH, context=context, timeout=5) as resp:
            assert json.loads(resp.read())["keys"][0]["kid"] == "ce-k8s-testbed-1"
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):   # not without the test CA
            urllib.request.urlopen(issuer.url + WELL_KNOWN, context=ssl.create_default_context(), timeout=5)
    finally:
        assert issuer.stop() and pid
    assert not issuer.stop()
