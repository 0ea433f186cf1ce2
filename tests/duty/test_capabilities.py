"""One record per capability (issue 38): the tuple node.capabilities.CAPABILITIES is what the CLI, the runtime's
settings and services, and the API iterate; a record added to it is a command, flags, settings and services, with
nothing else to list. In-process: argparse, the records, a real Node built (not started) in test_parts."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from node import capabilities, cli
from node.batch.settings import BatchSettings
from node.compute.cheats import OUTPUT_FAULTS, WEIGHT_FAULTS
from node.config import NodeConfig
from node.duty.capability import Built, Capability, Command, StartOptions, settings_of
from node.ledger.core import modules
from node.ledger.core.module import Module
from node.market.settings import MarketSettings
from node.settle.settings import SettleSettings


def test_the_tuple_is_each_package_record_with_its_ledger_module():
    caps = {c.name: c for c in capabilities.CAPABILITIES}
    assert list(caps) == ["market", "training", "batch", "settle", "disputes"]  # the order their services start in
    assert {c.name: [m.name for m in c.ledger] for c in caps.values()} == {
        "market": ["jobs"], "training": ["runs"], "batch": ["batches"], "settle": ["tabs"], "disputes": ["disputes"]}
    assert {cmd.name for c in caps.values() for cmd in c.commands} == {"job", "run", "batch"}
    for c in caps.values():
        assert c.settings is None or issubclass(NodeConfig, c.settings)
        assert c.router is None or c.router().routes  # each router is its package's, with routes


def test_check_refuses_a_name_or_command_twice_or_a_module_outside_the_ledger():
    caps = capabilities.CAPABILITIES
    with pytest.raises(ValueError, match="share a name"):
        capabilities.check_capabilities((*caps, caps[0]))
    with pytest.raises(ValueError, match="same command"):
        capabilities.check_capabilities((*caps, Capability("other", commands=caps[0].commands)))
    with pytest.raises(ValueError, match="not in ledger MODULES"):
        capabilities.check_capabilities((*caps, Capability("stray", ledger=(Module("stray"),))))
    capabilities.check_capabilities(caps)  # the real tuple passes
    assert all(m in modules.MODULES for c in caps for m in c.ledger)


def test_check_refuses_a_ledger_module_no_record_owns():
    caps = capabilities.CAPABILITIES
    without_batch = tuple(c for c in caps if c.name != "batch")
    with pytest.raises(ValueError, match=r"no capability record: \['batches'\]"):
        capabilities.check_capabilities(without_batch)
    with pytest.raises(ValueError, match=r"no capability record: \['staking'\]"):
        capabilities.check_capabilities(caps, base=("bank", "receipts", "history"))
    capabilities.check_capabilities(without_batch, base=(*capabilities.BASE_MODULES, "batches"))


def test_test_cheats_come_from_the_records_unique_and_explained():
    caps = capabilities.CAPABILITIES
    record_faults = [f for c in caps for f in c.faults]
    assert cli.BASE_FAULTS + record_faults == cli.FAULTS
    assert {"skip-steps", "run-zero", "run-copyroot"} <= set(record_faults)  # the market's and the runs' cheats
    assert len(set(cli.FAULTS)) == len(cli.FAULTS)
    assert set(OUTPUT_FAULTS) | set(WEIGHT_FAULTS) <= set(cli.BASE_FAULTS)  # every span cheat the server knows
    for f in cli.FAULTS:
        assert f in cli.TEST_SWITCH_HELP
    parser = cli.build_parser()
    assert parser.parse_args(["start", "--fault", "run-zero"]).fault == "run-zero"
    with pytest.raises(SystemExit):
        parser.parse_args(["start", "--fault", "no-such-cheat"])
    market = next(c for c in caps if c.name == "market")
    with pytest.raises(ValueError, match="same test cheat"):
        capabilities.check_capabilities((*caps, Capability("other", faults=market.faults[:1],
                                                           fault_help=f"'{market.faults[0]}' again")))
    with pytest.raises(ValueError, match="does not explain"):
        capabilities.check_capabilities((*caps, Capability("other", faults=("new-cheat",), fault_help="nothing")))


def test_node_config_has_every_capability_part_and_settings_of_reads_it(tmp_path):
    fields = {f.name for f in dataclasses.fields(NodeConfig)}
    for part in (MarketSettings, BatchSettings, SettleSettings):
        assert {f.name for f in dataclasses.fields(part)} <= fields
    cfg = NodeConfig(data_dir=tmp_path, genesis=None, model_dir=tmp_path, accept_jobs=True, batch_floor=7)  # type: ignore[arg-type]
    assert settings_of(cfg, MarketSettings).accept_jobs and settings_of(cfg, BatchSettings).batch_floor == 7
    with pytest.raises(TypeError, match="no Path part"):
        settings_of(cfg, Path)


def test_start_flags_come_from_the_records_and_their_errors_are_the_users():
    args = cli.build_parser().parse_args(["start", "--accept-jobs", "--job-capacity", "3", "--accept-batches",
                                          "--batch-floor", "0.0001"])
    by_name = {c.name: c for c in capabilities.CAPABILITIES}
    assert by_name["market"].start.settings(args) == MarketSettings(accept_jobs=True, job_capacity=3)
    assert by_name["batch"].start.settings(args) == BatchSettings(accept_batches=True, batch_floor=100_000)
    lone_floor = cli.build_parser().parse_args(["start", "--batch-floor", "0.0001"])
    with pytest.raises(ValueError, match="give both"):
        by_name["batch"].start.settings(lone_floor)
    assert by_name["settle"].start.settings(args) == SettleSettings()  # 10 credits unless told
    lock = cli.build_parser().parse_args(["start", "--tab-lock", "2.5"])
    assert by_name["settle"].start.settings(lock) == SettleSettings(tab_lock=2_500_000_000)
    with pytest.raises(ValueError, match="more than 0"):
        by_name["settle"].start.settings(cli.build_parser().parse_args(["start", "--tab-lock", "0"]))


def test_a_record_added_to_the_tuple_is_a_command_flags_and_settings(monkeypatch):
    """What adding a capability takes on the node side: its record, one line in the tuple."""
    ran: list[argparse.Namespace] = []

    def add(sub: argparse._SubParsersAction, data_dir: Path) -> None:
        p = sub.add_parser("ping", help="ping")
        p.add_argument("--data-dir", type=Path, default=data_dir)

    def flags(s: argparse.ArgumentParser) -> None:
        s.add_argument("--ping-every", type=int, default=5)

    ping = Capability("ping", build=lambda parts: Built(), commands=(Command("ping", add, ran.append),),
                      start=StartOptions(add=flags, settings=lambda a: {"every": a.ping_every}))
    monkeypatch.setattr(cli, "CAPABILITIES", (*capabilities.CAPABILITIES, ping))
    parser = cli.build_parser()
    args = parser.parse_args(["ping", "--data-dir", "/tmp/x"])
    args.func(args)
    assert ran and ran[0].data_dir == Path("/tmp/x")
    assert parser.parse_args(["start", "--ping-every", "9"]).ping_every == 9
