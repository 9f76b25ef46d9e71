from __future__ import annotations

from pathlib import Path

from cli.postgres_local import PostgresNode, initdb_command, newest_bin_dir, server_command


def test_the_newest_installed_server_is_used(tmp_path: Path) -> None:
    # Given two installed majors and a folder that is not a server
    for major in ("13", "15"):
        (tmp_path / major / "bin").mkdir(parents=True)
        (tmp_path / major / "bin" / "initdb").touch()
    (tmp_path / "common" / "bin").mkdir(parents=True)
    # Then the highest major wins
    assert newest_bin_dir(tmp_path.glob("*/bin")) == tmp_path / "15" / "bin"


def test_no_server_installed_is_none(tmp_path: Path) -> None:
    assert newest_bin_dir(tmp_path.glob("*/bin")) is None


def test_the_cluster_trusts_local_connections_and_listens_on_loopback_only() -> None:
    node = PostgresNode(port=15432, home=Path("/t/pg"))
    init = initdb_command(Path("/b"), node)
    assert init[init.index("--auth") + 1] == "trust"
    assert init[init.index("--pgdata") + 1] == "/t/pg/cluster"
    server = server_command(Path("/b"), node)
    assert server[:5] == ["/b/postgres", "-D", "/t/pg/cluster", "-p", "15432"]
    assert "listen_addresses=127.0.0.1" in server
    assert node.url == "postgresql+psycopg://postgres@127.0.0.1:15432/postgres"
