"""HTCondor's argument and environment quoting, parsed exactly as condor_arglist.cpp / env.cpp do.

Why our own parser (and never a shell): the pilot's `Arguments` become the container's `args` in
exec form, so each word must come out exactly as HTCondor's starter would have passed it to
execve(), with no shell ever seeing job text. Standard library only (docs/internals.md).

Syntaxes (HTCondor `src/condor_utils/condor_arglist.cpp`, `env.cpp`; condor_submit docs):

* **V2 raw** — what a job ad stores in `Arguments` / `Environment`: words separated by spaces,
  tabs, CR or LF; a single-quoted section groups (may contain whitespace); inside it `''` is one
  literal `'`; an unterminated quote is an error. Double quotes are ordinary characters.
* **V2 quoted** — the submit-file form: the whole V2 raw string enclosed in double quotes, with
  `""` standing for one `"`; only whitespace may follow the closing quote.
* **V1 raw args** — `Args`: split on whitespace, no quoting at all (Unix rules).
* **V1 wacked args** — the submit-file V1 form: `\\"` is a literal `"`, a bare `"` is an error.
* **V1 raw env** — `Env`: entries separated by `;` (or newline); leading whitespace of each entry
  is dropped; everything else is literal.

Environment entries are `NAME=VALUE`; an entry without `=` or with an empty name is an error
(HTCondor's SetEnvWithErrorMessage), except HTCondor's unexpanded `$$(...)` entries, which are
kept out of the result (they are meaningless outside a startd). Later duplicates win.
"""

from __future__ import annotations

_WHITESPACE = " \t\r\n"


class ArgsError(ValueError):
    """An argument or environment string that HTCondor itself would refuse."""


def split_v2_raw(text: str) -> list[str]:
    """Words of a V2 raw string (condor_arglist.cpp split_args)."""
    words: list[str] = []
    buf: list[str] = []
    in_word = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "'":
            start = i
            i += 1
            in_word = True
            while True:
                if i >= n:
                    raise ArgsError(f"unbalanced single quote starting here: {text[start:start + 40]}")
                if text[i] == "'":
                    if i + 1 < n and text[i + 1] == "'":
                        buf.append("'")
                        i += 2
                        continue
                    i += 1
                    break
                buf.append(text[i])
                i += 1
        elif c in _WHITESPACE:
            i += 1
            if in_word:
                words.append("".join(buf))
                buf = []
                in_word = False
        else:
            buf.append(c)
            in_word = True
            i += 1
    if in_word:
        words.append("".join(buf))
    return words


def is_v2_quoted(text: str) -> bool:
    """HTCondor's test: the first non-whitespace character is a double quote."""
    return text.lstrip(_WHITESPACE + "\v\f").startswith('"')


def v2_quoted_to_raw(text: str) -> str:
    """Strip the submit-file double quotes of a V2 string, turning `""` back into `"`."""
    s = text.lstrip(_WHITESPACE + "\v\f")
    if not s.startswith('"'):
        raise ArgsError("expecting a double-quoted (V2) string")
    out: list[str] = []
    i, n = 1, len(s)
    while True:
        if i >= n:
            raise ArgsError("unterminated double quote")
        if s[i] == '"':
            if i + 1 < n and s[i + 1] == '"':
                out.append('"')
                i += 2
                continue
            rest = s[i + 1:]
            if rest.strip(_WHITESPACE + "\v\f"):
                raise ArgsError(
                    f"unexpected characters after the closing double quote (repeat a quote to escape it): {rest[:40]}"
                )
            return "".join(out)
        out.append(s[i])
        i += 1


def split_v1_raw(text: str) -> list[str]:
    """Words of a V1 raw `Args` string: split on space/tab/CR/LF only, no quoting (Unix rules)."""
    return [w for w in _split_on(text, _WHITESPACE) if w]


def _split_on(text: str, seps: str) -> list[str]:
    out: list[str] = []
    buf: list[str] = []
    for c in text:
        if c in seps:
            out.append("".join(buf))
            buf = []
        else:
            buf.append(c)
    out.append("".join(buf))
    return out


def v1_wacked_to_raw(text: str) -> str:
    """Submit-file V1 args: `\\"` is a literal quote; any other double quote is an error."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == '"':
            raise ArgsError(f"illegal unescaped double quote: {text[i:i + 40]}")
        if text[i] == "\\" and i + 1 < n and text[i + 1] == '"':
            out.append('"')
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def split_submit_args(text: str) -> list[str]:
    """A submit-file `arguments` value: V2 if double-quoted, else V1 wacked."""
    if is_v2_quoted(text):
        return split_v2_raw(v2_quoted_to_raw(text))
    return split_v1_raw(v1_wacked_to_raw(text))


def job_args(arguments: str | None, args: str | None) -> list[str]:
    """The argv tail of a job ad: `Arguments` (V2 raw) wins over `Args` (V1 raw), as the starter does."""
    if arguments is not None:
        return split_v2_raw(arguments)
    if args is not None:
        return split_v1_raw(args)
    return []


# -- environment ----------------------------------------------------------------------------------

def _env_entry(entry: str, env: dict[str, str]) -> None:
    name, eq, value = entry.partition("=")
    if not eq:
        if "$$" in entry:
            return  # an unexpanded $$() macro: HTCondor keeps it verbatim only for the startd
        raise ArgsError(f"missing '=' after environment variable {entry[:60]!r}")
    if not name:
        raise ArgsError(f"missing variable name in {entry[:60]!r}")
    env[name] = value


def parse_env_v2_raw(text: str) -> dict[str, str]:
    """`Environment` (V2 raw): V2 words, each `NAME=VALUE`."""
    env: dict[str, str] = {}
    for word in split_v2_raw(text):
        _env_entry(word, env)
    return env


def parse_env_v1_raw(text: str, delimiter: str = ";") -> dict[str, str]:
    """`Env` (V1 raw): entries separated by `delimiter` or newline, leading whitespace dropped."""
    env: dict[str, str] = {}
    for entry in _split_on(text, delimiter + "\n"):
        entry = entry.lstrip(_WHITESPACE)
        if entry:
            _env_entry(entry, env)
    return env


def parse_submit_env(text: str) -> dict[str, str]:
    """A submit-file / config `environment` value: V2 if double-quoted, else V1 raw (MergeFromV1RawOrV2Quoted)."""
    if is_v2_quoted(text):
        return parse_env_v2_raw(v2_quoted_to_raw(text))
    return parse_env_v1_raw(text)


def job_env(environment: str | None, env: str | None, env_delim: str | None = None) -> dict[str, str]:
    """A job ad's environment: `Environment` (V2 raw) wins over `Env` (V1 raw), as Env::MergeFrom does."""
    if environment is not None:
        return parse_env_v2_raw(environment)
    if env is not None:
        delim = env_delim[:1] if env_delim else ";"
        return parse_env_v1_raw(env, delim)
    return {}


def join_v2_raw(words: list[str]) -> str:
    """The inverse of split_v2_raw (condor_arglist.cpp append_arg), for round-trip tests and display."""
    parts: list[str] = []
    for word in words:
        if word == "":
            parts.append("''")
        elif any(c in word for c in _WHITESPACE + "'"):
            parts.append("'" + word.replace("'", "''") + "'")
        else:
            parts.append(word)
    return " ".join(parts)
