"""UPDATE_JOB_INFO hook: forward the routed ad to the agent, print only what changed.

The router runs this once per routed job per poll (docs/hook-protocol.md §2.3, §8), so it is the
hottest code in ce-k8s: it imports almost nothing and asks the agent, which answers from its
watch cache. Exit codes are chosen so every failure has the mildest consequence:

* another backend's job (its `GridResource` does not start with the words of
  `CE_K8S_GRID_RESOURCE`, docs/routes.md "CEs with other backends"): exit 0, empty stdout, and the
  agent is never asked, so a Slurm or HTCondor pilot never depends on our agent being up;
* agent answered: exit 0, stdout = its lines (empty when nothing changed, the normal reply);
* agent unreachable, slow, refusing, or any doubt about the reply: exit 1 with no stdout, which
  the router treats as "no status sync this cycle" (hook-protocol.md §2.3). A parse error would instead remove
  the routed job and re-run the pilot, so nothing is printed unless every line is safe.
"""

import sys

from ce_k8s import protocol
from ce_k8s.hooks._common import ad_grid_resource, arm_deadline, grid_resource_matches, log, read_stdin, write_stdout

EXIT_NO_SYNC = 1

# Never printed, whatever the agent says: the schedd refuses or owns these (hook-protocol.md §2.3, §8).
_FORBIDDEN = frozenset({"clusterid", "procid", "owner", "user", "osuser", "jobuniverse", "mytype",
                        "targettype", "totalsubmitprocs"})
_FORBIDDEN_PREFIXES = ("x509", "authtoken")


def _is_number(tok: bytes) -> bool:
    """`-12`, `3.5`, `1e+20`: what `repr()` of a Python int or finite float gives."""
    mantissa, e, exponent = tok.lstrip(b"-").lower().partition(b"e")
    whole, _, frac = mantissa.partition(b".")
    if not (whole + frac).isdigit():
        return False
    return not e or exponent.lstrip(b"+-").isdigit()


def _safe_value(value: bytes) -> bool:
    """A literal the agent renders (`ce_k8s.agent.adtext.render`): a number/bool/undefined token,
    or a double-quoted string whose only escapes are `\\"` and that holds no control character.
    Anything else (unbalanced quotes, two values, an expression) is refused rather than risk a
    router parse error (hook-protocol.md §2.3), whatever the agent sent."""
    if any(c < 0x20 or c == 0x7F for c in value):
        return False
    if value[:1] == b'"':
        inner = value[1:-1].replace(b'\\"', b"")
        return len(value) >= 2 and value[-1:] == b'"' and b'"' not in inner and b"\\" not in inner
    if value[:1].isalpha() or value[:1] == b"_":          # true, false, undefined
        return value.replace(b"_", b"a").isalnum()
    return _is_number(value)


def safe_output(body: bytes) -> bool:
    """True when every line is `Name = value` the router's line parser accepts and we may set."""
    for line in body.split(b"\n"):
        if not line.strip():
            continue
        name, sep, value = line.partition(b" = ")
        if not sep or not _safe_value(value.strip()) or b"\r" in line:
            return False
        if not name or not (name[:1].isalpha() or name[:1] == b"_"):
            return False
        if not name.replace(b"_", b"a").isalnum():
            return False
        low = name.lower().decode("ascii")
        if low in _FORBIDDEN or low.startswith(_FORBIDDEN_PREFIXES):
            return False
    return True


def main() -> int:
    path, timeout = protocol.hook_settings()
    arm_deadline(timeout, EXIT_NO_SYNC)
    data = read_stdin()
    if data is None:
        return EXIT_NO_SYNC
    if not grid_resource_matches(ad_grid_resource(data), protocol.hook_grid_resource()):
        return 0
    try:
        answer = protocol.ask(path, protocol.VERB_UPDATE, data, timeout)
    except (OSError, protocol.ProtocolError) as exc:
        log(f"agent at {path} unreachable: {exc}; no sync this cycle")
        return EXIT_NO_SYNC
    if answer.status != protocol.STATUS_OK or len(answer.parts) != 1:
        log(f"agent answered {answer.status}: {answer.message()}; no sync this cycle")
        return EXIT_NO_SYNC
    if not safe_output(answer.parts[0]):
        log("agent reply failed the output check; no sync this cycle")
        return EXIT_NO_SYNC
    write_stdout(answer.parts[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
