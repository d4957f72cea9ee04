"""Which Hypothesis example database the command line's campaigns share.

A campaign saves every failure it finds in Hypothesis's example database under a key made of the
implementation's name, the dtype and the profile, and replays what is saved there before drawing
anything new: a failure found by one run, one worker or one host is judged first by the next.
The stores are Hypothesis's own:

    a directory    DirectoryBasedExampleDatabase: safe for many processes at once, and for
                   several hosts on one shared filesystem (NFS, a mounted volume)
    redis://host:port[/db]
                   hypothesis.extra.redis.RedisExampleDatabase (`pip install 'hypothesis[redis]'`)
    off            no database: a run draws exactly what its --hypothesis-seed gives

Chosen by `--database`, else FUZZATTN_DATABASE, else DEFAULT_DIR beside the regressions directory
(`./.fuzzattn/examples` for the default `./regressions`): where the readable regression files
are kept, the raw examples are too, and a run with its own --regressions-dir (a test, a scratch
run) keeps its own.
"""
from __future__ import annotations

import os
import sys
import tempfile
import urllib.parse
from pathlib import Path

ENV = "FUZZATTN_DATABASE"
OFF = "off"
DEFAULT_DIR = Path(".fuzzattn") / "examples"      # relative to the regressions directory's parent
REDIS_PORT = 6379
FALLBACK_DIR = "fuzzattn-examples"    # under the temporary directory, when the default cannot be made


class DatabaseError(ValueError):
    """A database setting that cannot be used: one line naming it."""


def key(cli_name: str, dtype: str | None, profile: str) -> bytes:
    """A campaign's key: stable across code edits (never the test function's source)."""
    return f"fuzzattn:{cli_name}:{dtype or 'all'}:{profile}".encode()


def choose(value: str | None, regressions_dir) -> tuple[str, str]:
    """(spec, where it came from) for --database VALUE, else FUZZATTN_DATABASE, else the default."""
    if value is not None:
        return value, "--database"
    env = os.environ.get(ENV)
    if env is not None:
        return env, ENV
    return str(Path(regressions_dir).parent / DEFAULT_DIR), "default"


def _redis_address(spec: str, source: str) -> tuple[str, int, int]:
    parsed = urllib.parse.urlsplit(spec)
    try:
        port = parsed.port or REDIS_PORT
    except ValueError:
        raise DatabaseError(f"{source} {spec!r}: the port is not a number") from None
    path = parsed.path.strip("/")
    if not parsed.hostname:
        raise DatabaseError(f"{source} {spec!r}: no host (redis://host:port[/db])")
    if path and not path.isdigit():
        raise DatabaseError(f"{source} {spec!r}: the database number {path!r} is not a whole number")
    if parsed.query or parsed.fragment:
        raise DatabaseError(f"{source} {spec!r}: unexpected ?query or #fragment (redis://host:port[/db])")
    return parsed.hostname, port, int(path or 0)


def check(spec: str, source: str = "--database") -> None:
    """Raise DatabaseError unless `spec` names a usable database (without creating anything)."""
    if not spec.strip():
        raise DatabaseError(f"{source} is empty: a directory, redis://host:port[/db], or {OFF}")
    if spec == OFF:
        return
    if spec.startswith("redis://"):
        _redis_address(spec, source)
        return
    if "://" in spec:
        raise DatabaseError(f"{source} {spec!r}: not a directory, a redis://host:port[/db] URL, or {OFF}")
    path = Path(spec)
    if path.exists() and not path.is_dir():
        raise DatabaseError(f"{source} {spec!r} is not a directory")


def open_database(spec: str, source: str = "--database"):
    """The ExampleDatabase `spec` names (None for off); DatabaseError when it cannot be used."""
    check(spec, source)
    if spec == OFF:
        return None
    if spec.startswith("redis://"):
        host, port, db = _redis_address(spec, source)
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError:
            raise DatabaseError(f"{source} {spec}: the redis package is not installed: "
                                "pip install 'hypothesis[redis]'") from None
        client = redis.Redis(host=host, port=port, db=db)
        try:
            client.ping()
        except Exception as exc:        # redis.ConnectionError, a refused or timed-out socket
            raise DatabaseError(f"{source} {spec}: cannot reach it: {' '.join(str(exc).split())}") from None
        return RedisExampleDatabase(client)
    from hypothesis.database import DirectoryBasedExampleDatabase
    problem = _unusable(spec)
    if problem is not None and source == "default":
        # as an unwritable regressions directory does: fall back, say where and why, go on
        fallback = str(Path(tempfile.gettempdir()) / FALLBACK_DIR)
        print(f"fuzzattn: example database {spec!r}: {problem}; using {fallback}", file=sys.stderr)
        spec, problem = fallback, _unusable(fallback)
    if problem is not None:
        raise DatabaseError(f"{source} {spec!r}: {problem}")
    return DirectoryBasedExampleDatabase(spec)


def _unusable(directory: str) -> str | None:
    """Why `directory` cannot hold the database (created if absent), or None."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create the directory: {exc.strerror}"
    if not os.access(directory, os.W_OK):
        return "the directory is not writable"
    return None
