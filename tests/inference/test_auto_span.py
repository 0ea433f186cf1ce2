"""``node start --span auto``: servers joining one after another serve the weakest-covered blocks, and an
announcement that would expire before its refresh is refused at start."""

from __future__ import annotations

import pytest
import trio

from node.compute.reference import local_generate
from node.runtime import Node

from .procs import config, start_nodes, wait_live, write_genesis


def test_servers_started_one_after_another_tile_the_model(tmp_path, tiny):
    gfile = write_genesis(tmp_path, servers=[1, 2, 3], clients=[0])

    async def main():
        async with trio.open_nursery() as n:
            (client,) = await start_nodes(n, [config(tmp_path, 0, gfile, tiny)])
            boot = client.host.addrs
            servers = []
            for k in (1, 2, 3):
                servers += await start_nodes(n, [config(tmp_path, k, gfile, tiny, span="auto", auto_blocks=2,
                                                        bootstrap=boot)])
                await wait_live(client, k, timeout=30)
            gen = await client.generate([3, 1, 4], 6)
            n.cancel_scope.cancel()
            return [s.cfg.span for s in servers], gen

    spans, gen = trio.run(main)
    assert spans == [(0, 2), (2, 4), (4, 6)]
    assert gen.tokens == local_generate(tiny, [3, 1, 4], 6)


def test_announcement_ttl_must_exceed_the_refresh_period(tmp_path, tiny):
    gfile = write_genesis(tmp_path, servers=[1], clients=[0])
    with pytest.raises(ValueError, match="strictly longer"):
        Node(config(tmp_path, 1, gfile, tiny, span=(0, 6), announce_period=2.0, announce_ttl=2.0))


def test_cli_parses_span_auto_and_compression():
    from node.cli import build_parser

    p = build_parser()
    a = p.parse_args(["start", "--span", "auto:4", "--compression", "fp16+zstd"])
    assert a.span == ("auto", 4) and a.compression == "fp16+zstd"
    assert p.parse_args(["start", "--span", "auto"]).span == ("auto", None)
    assert p.parse_args(["start", "--span", "2:5"]).span == (2, 5)
    for bad in (["--span", "auto:0"], ["--span", "auto:x"], ["--compression", "gzip"]):
        with pytest.raises(SystemExit):
            p.parse_args(["start", *bad])
