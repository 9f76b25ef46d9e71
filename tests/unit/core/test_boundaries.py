"""Which package may import which (docs/design.md §6, "Boundaries"), checked on the source:
the core imports no adapter, the process packages reach each other only through the core and
``state/``, ``state/`` imports nothing above it, and every Redis command is written in
``state/``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("setu", "state", "delivery", "api", "spark", "cli", "bench", "migrations")
# What each package may import of the project, besides itself (cli and bench: anything).
ALLOWED = {
    "setu": set(),
    "state": {"setu"},
    "api": {"setu", "state"},
    "delivery": {"setu", "state"},
    "spark": {"setu", "state"},
    "migrations": {"setu", "state"},
}
# Libraries that talk to a service or serve a process: never in the core.
ADAPTER_LIBRARIES = (
    "redis",
    "confluent_kafka",
    "sqlalchemy",
    "alembic",
    "fastapi",
    "starlette",
    "uvicorn",
    "pyspark",
)
# Redis commands as redis-py spells them: called only in state/ (and by cli/ and bench/).
REDIS_COMMANDS = frozenset(
    {
        "aclose", "eval", "evalsha", "exists", "expire", "flushall", "flushdb", "hdel", "hget",
        "hgetall", "hincrby", "hmget", "hset", "incr", "incrby", "lpop", "lpush", "lrange",
        "mget", "pexpire", "ping", "pipeline", "psetex", "register_script", "rpush", "sadd",
        "scan_iter", "setex", "smembers", "srem", "unlink", "xack", "xadd", "xclaim",
        "xgroup_create", "xpending_range", "xreadgroup", "zadd", "zrange", "zrangebyscore",
        "zrem",
    }
)  # fmt: skip
# Calls that share a name with a Redis command and are not one: (file, call).
NOT_REDIS = {("spark/rejects.py", "fn.exists")}  # Spark's SQL function


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of each absolute import."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_its_layer_may(package: str) -> None:
    allowed = ALLOWED[package] | {package}
    wrong = [
        f"{where(path, line)} imports {name}"
        for path in modules(package)
        for line, name in imported(path)
        if name.split(".")[0] in PACKAGES and name.split(".")[0] not in allowed
    ]
    assert wrong == []


def test_the_core_imports_no_adapter_library() -> None:
    wrong = [
        f"{where(path, line)} imports {name}"
        for path in modules("setu")
        for line, name in imported(path)
        if name.split(".")[0] in ADAPTER_LIBRARIES
    ]
    assert wrong == []


@pytest.mark.parametrize("package", ["setu", "api", "delivery", "spark", "migrations"])
def test_no_redis_command_is_sent_outside_state(package: str) -> None:
    wrong = []
    for path in modules(package):
        relative = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in REDIS_COMMANDS
                and (relative, ast.unparse(node.func)) not in NOT_REDIS
            ):
                wrong.append(f"{where(path, node.lineno)} calls {ast.unparse(node.func)}")
    assert wrong == []


def test_the_check_sees_a_wrong_import_and_a_redis_call(tmp_path: Path) -> None:
    # The checks above read real source: this proves they would see a breach.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from delivery.kafka_io import X\n\nasync def f(r):\n    await r.xadd('s', {})\n"
    )
    assert [name for _, name in imported(sample)] == ["delivery.kafka_io"]
    calls = [n for n in ast.walk(ast.parse(sample.read_text())) if isinstance(n, ast.Call)]
    assert any(isinstance(c.func, ast.Attribute) and c.func.attr in REDIS_COMMANDS for c in calls)
