"""Tokens and environments for the pilot's tests."""

from __future__ import annotations

import base64
import json
from pathlib import Path


def b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def jwt(claims: dict | None = None) -> str:
    """A JWT of the IDTOKEN shape (HTCondor's header, these claims, a signature nobody checks here)."""
    claims = {"iss": "vo.ce-k8s.test", "sub": "pilot@vo.ce-k8s.test", "iat": 1_700_000_000,
              "jti": "0123456789abcdef", **(claims or {})}
    return f"{b64({'alg': 'HS256', 'kid': 'POOL'})}.{b64(claims)}.{'s' * 43}"


def write_token(directory: Path, text: str | None = None) -> Path:
    path = directory / "secret" / "idtoken"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((text if text is not None else jwt()) + "\n")
    return path


def pilot_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment a pod gives the pilot: collector, token path, a writable local dir."""
    return {"CE_K8S_PILOT_COLLECTOR": "vo-cm.vo.svc:9618",
            "CE_K8S_PILOT_TOKEN_FILE": str(write_token(tmp_path)),
            "CE_K8S_PILOT_LOCAL_DIR": str(tmp_path / "scratch" / "pilot"),
            "CE_K8S_PILOT_NAME": "pilot-abc",
            "CE_K8S_PILOT_CPUS": "2", "CE_K8S_PILOT_MEMORY_MB": "4096",
            **extra}
