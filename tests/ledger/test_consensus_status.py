"""The consensus state a validator reports (``ConsensusDriver.status``, ``consensus`` in ``/v1/status``) and what a
stuck validator re-sends: four real validators (:class:`LedgerService` with its driver over real libp2p hosts on
127.0.0.1, LevelDB in a tmp dir) cut off from each other's consensus traffic, then healed. Bounds are on heights,
rounds and counts, never on absolute times."""

from __future__ import annotations

import pytest
import trio

from node.identity import account_to_str
from node.ledger.driver import RESEND_MAX, RESEND_PERIOD

from .test_idle import quiet_genesis, validators, wait_height

CUT_S = 8.0  # seconds every validator is alone


def published(node) -> int:
    return node.host.gossip_counts().published["consensus"]


@pytest.mark.slow  # ~17 s: in CI's slow step, so the README's test command keeps its margin under 5 minutes
def test_status_shows_who_is_stuck_where_a_stuck_validator_resends_at_a_bounded_rate_then_progress(tmp_path):
    g = quiet_genesis(n_validators=4, heartbeat_ms=0, block_time_ms=200)

    async def main():
        async with validators(tmp_path, g) as nodes:
            await wait_height(nodes, 2, timeout=60)
            for x in nodes:  # every validator alone: no consensus message or sync from anyone
                x.drop = lambda peer: True
            await trio.sleep(3.0)  # > the propose timeout: each prevotes nil, alone, and waits for a quorum
            h0 = max(x.state.height for x in nodes)
            cut, pub0, res0 = [x.driver.status() for x in nodes], [published(x) for x in nodes], \
                [x.driver.resends for x in nodes]
            await trio.sleep(CUT_S)
            later, pub1 = [x.driver.status() for x in nodes], [published(x) for x in nodes]
            stuck_heights = [x.state.height for x in nodes]
            for x in nodes:
                x.drop = None
            await wait_height(nodes, h0 + 2, timeout=60)
            return (h0, cut, later, stuck_heights, [b - a for a, b in zip(pub0, pub1, strict=True)],
                    [s["resends"] - r for s, r in zip(later, res0, strict=True)], [x.driver.status() for x in nodes])

    h0, cut, later, stuck, pubs, resends, healed = trio.run(main)
    assert max(stuck) <= h0  # nobody decided alone
    for s, s2 in zip(cut, later, strict=True):
        assert (s["height"], s["round"], s["step"]) == (s2["height"], s2["round"], s2["step"])  # stuck where it was
        assert s["step"] in ("prevote", "precommit"), s
        assert s["power"] == 4 and s["quorum"] == 3
        assert 1 <= s["prevotes"] < 3 and s["precommits"] < 3, s  # its own vote, at most one more from before
        assert s2["round_age_s"] > s["round_age_s"] >= 2.0, (s, s2)
        assert s2["last_commit_age_s"] > s["last_commit_age_s"] >= 2.0
        assert account_to_str(s["proposer"]) in {account_to_str(a) for a in g.validators}
    # stuck for CUT_S more seconds, each re-broadcast its messages (a proposal and two votes at most) at waits
    # doubling from RESEND_PERIOD to RESEND_MAX: at most CUT_S / RESEND_MAX + 2 times (re-sending every second, as
    # before, was CUT_S / RESEND_PERIOD times, up to 3 messages each)
    most = int(CUT_S / RESEND_MAX) + 2
    assert most < CUT_S / RESEND_PERIOD
    assert all(1 <= r <= most for r in resends), resends
    assert all(p <= 3 * most for p in pubs), pubs
    for s in healed:
        assert s["height"] >= h0 + 2 and s["last_commit_age_s"] < 3.0, s
