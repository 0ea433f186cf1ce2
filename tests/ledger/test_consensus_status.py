"""The consensus state a validator reports (``ConsensusDriver.status``, ``consensus`` in ``/v1/status``): four real
validators (:class:`LedgerService` with its driver over real libp2p hosts on 127.0.0.1, LevelDB in a tmp dir)
cut off from each other's consensus traffic, then healed. Bounds are on heights, rounds and counts, never on
absolute times."""

from __future__ import annotations

import trio

from node.identity import account_to_str

from .test_idle import quiet_genesis, validators, wait_height


def test_status_shows_who_is_stuck_in_which_round_and_step_then_progress(tmp_path):
    g = quiet_genesis(n_validators=4, heartbeat_ms=0, block_time_ms=200)

    async def main():
        async with validators(tmp_path, g) as nodes:
            await wait_height(nodes, 2, timeout=60)
            for x in nodes:  # every validator alone: no consensus message or sync from anyone
                x.drop = lambda peer: True
            await trio.sleep(0.5)  # a height that was being decided finishes or stalls
            h0 = max(x.state.height for x in nodes)
            await trio.sleep(4.0)  # > the propose timeout (1 s): each prevotes nil, alone, and waits for a quorum
            cut = [x.driver.status() for x in nodes]
            stuck_heights = [x.state.height for x in nodes]
            await trio.sleep(1.0)
            later = [x.driver.status() for x in nodes]
            for x in nodes:
                x.drop = None
            await wait_height(nodes, h0 + 2, timeout=60)
            return h0, cut, later, stuck_heights, [x.driver.status() for x in nodes]

    h0, cut, later, stuck, healed = trio.run(main)
    assert max(stuck) <= h0  # nobody decided alone
    for s, s2 in zip(cut, later, strict=True):
        assert s["height"] == s2["height"] and s["round"] == s2["round"]  # stuck where it was
        assert s["step"] in ("prevote", "precommit"), s
        assert s["power"] == 4 and s["quorum"] == 3
        assert 1 <= s["prevotes"] < 3 and s["precommits"] < 3, s  # its own vote, at most one more from before
        assert s2["round_age_s"] > s["round_age_s"] >= 3.0, (s, s2)
        assert s2["last_commit_age_s"] > s["last_commit_age_s"] >= 3.0
        assert account_to_str(s["proposer"]) in {account_to_str(a) for a in g.validators}
    for s in healed:
        assert s["height"] >= h0 + 2 and s["last_commit_age_s"] < 3.0, s
