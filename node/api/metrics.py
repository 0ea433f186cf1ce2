"""``/metrics`` in the Prometheus text format, read from the node's state at scrape time.

Each node has its own registry (several nodes may share a process in tests). Families (all prefixed ``tally_``):

* ledger: ``block_height``, ``blocks_total``, ``transactions_total``, ``ledger_block_bytes_total`` (bytes of
  stored blocks), ``mempool_transactions``, ``validators``, ``supply_base_units``;
* verification: ``receipts_total`` (archived ones included), ``receipts_archived``, ``receipts{status}``,
  ``receipts_sampled_total``, ``votes_total{verdict}``,
  ``verdicts_total{verdict}`` (valid/invalid quorums), ``slashes_total``, ``slashed_base_units_total``;
* sessions: ``sessions_served_total`` and ``sessions_active`` (this node as a server), ``tokens_served_total``,
  ``ledger_sessions_total`` (inference sessions receipted on the ledger);
* network: ``p2p_stream_bytes_total{direction}`` (framed protocol bytes of this process), ``peers``,
  ``gossip_sent_total{kind}`` (``publish:consensus``, ``ihave:shards``, ...), ``gossip_received_total{topic}``,
  ``gossip_published_total{topic}`` (:class:`node.p2p.gossip.GossipCounts`),
  ``swarm_servers``, ``swarm_blocks_covered``, ``reply_bytes_in_flight`` and ``replies_refused_total{cap}``
  (:class:`node.p2p.budget.ReplyBudget`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..ledger.core.history import read_head
from ..ledger.core.status import ReceiptStatus
from ..ledger.core.tx import Verdict
from ..p2p.framing import STATS
from .deps import NodeAPI
from .queries import Queries

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


Value = float | Mapping[str, float]  # one sample, or one per label value (with ``labels``)


def _family(fam: GaugeMetricFamily | CounterMetricFamily, val: Value) -> Metric:
    if isinstance(val, Mapping):
        for k, x in val.items():
            fam.add_metric([k], x)
    else:
        fam.add_metric([], val)
    return fam


class NodeCollector:
    """A Prometheus collector of one node's families (see the module docstring), read at each scrape."""

    def __init__(self, node: NodeAPI, queries: Queries) -> None:
        self.node, self.q = node, queries

    def collect(self) -> Iterator[Metric]:
        """The families, from the node's state and its views now."""
        n, st = self.node, self.node.ledger.state
        meta = n.store.index_meta()

        def gauge(name: str, doc: str, val: Value, labels: Iterable[str] | None = None) -> Metric:
            return _family(GaugeMetricFamily(f"tally_{name}", doc, labels=list(labels) if labels else None), val)

        def counter(name: str, doc: str, val: Value, labels: Iterable[str] | None = None) -> Metric:
            return _family(CounterMetricFamily(f"tally_{name}", doc, labels=list(labels) if labels else None), val)

        ver = self.q.verification(1)
        yield gauge("block_height", "Height of the ledger head", st.height)
        yield counter("blocks", "Blocks finalized and stored", st.height)
        yield counter("transactions", "Transactions in stored blocks", meta[3])
        yield counter("ledger_block_bytes", "Bytes of stored blocks (with their commits)", meta[2])
        yield gauge("mempool_transactions", "Transactions waiting for a block", len(n.ledger.mempool))
        yield gauge("validators", "Size of the validator set", len(st.validators))
        yield gauge("supply_base_units", "Total balance + bond + escrow", st.supply())
        archived = read_head(st).size  # receipts that left the hot state (node.ledger.core.history)
        yield counter("receipts", "Receipts on the ledger (in the state or archived)", ver["receipts"] + archived)
        yield gauge("receipts_archived", "Receipts that left the hot state into the history log", archived)
        yield gauge("receipts_by_status", "Receipts on the ledger by verification status",
                    {k.value: ver[k.value] for k in ReceiptStatus if k is not ReceiptStatus.SAMPLED}, ["status"])
        yield counter("receipts_sampled", "Receipts sampled for re-execution by a committee", ver["sampled"])
        yield counter("votes", "Committee votes on the ledger", ver["votes"], ["verdict"])
        yield counter("verdicts", "Committee verdicts (quorums) on the ledger",
                      {v.label: ver[v.label] for v in (Verdict.VALID, Verdict.INVALID)}, ["verdict"])
        yield counter("slashes", "Bonds slashed (invalid work or double signing)", ver["slashes"])
        yield counter("slashed_base_units", "Base units slashed", int(ver["slashed"]["base_units"]))
        server = n.server
        yield counter("sessions_served", "Inference sessions this node served and receipted",
                      server.sessions_served if server else 0)
        yield gauge("sessions_active", "Inference sessions open on this node",
                    server.active if server else 0)
        yield counter("tokens_served", "Token positions this node's span processed",
                      server.tokens_served if server else 0)
        yield counter("ledger_sessions", "Inference sessions receipted on the ledger", len(st.sessions))
        yield counter("p2p_stream_bytes", "Bytes of framed protocol messages (this process)",
                      {"sent": STATS["sent"], "received": STATS["received"]}, ["direction"])
        yield gauge("peers", "Connected libp2p peers", len(n.host.connected_peers()))
        b = n.reply_budget.stats()  # node.p2p.budget: memory of bulk replies in flight, refusals
        yield gauge("reply_bytes_in_flight", "Bytes reserved by bulk replies being written now (blocks, batch "
                    "content, blobs, snapshot chunks, sync)", b["in_flight_bytes"])
        yield counter("replies_refused", "Bulk replies refused as busy, by the budget cap that was full",
                      {"peer": b["refused_peer"], "node": b["refused_node"]}, ["cap"])
        gc = n.host.gossip_counts()
        yield counter("gossip_sent", "Gossip RPC items sent to peers (publish: per receiving peer; ihave/iwant: "
                      "message ids)", {f"{k}:{t}" if t else k: x for (k, t), x in sorted(gc.sent.items())}, ["kind"])
        yield counter("gossip_received", "Published gossip messages received from peers, duplicates included",
                      dict(gc.received), ["topic"])
        yield counter("gossip_published", "Gossip messages this node originated", dict(gc.published), ["topic"])
        sw = self.q.swarm()
        yield gauge("swarm_servers", "Live servers of this node's model",
                    sum(1 for x in sw["servers"] if x["model_id"] == sw["model_id"]))
        yield gauge("swarm_blocks_covered", "Decoder blocks held by at least one live server", sw["covered"])


def metrics_registry(node: NodeAPI, queries: Queries) -> CollectorRegistry:
    """A registry (of its own: several nodes may share a process) holding ``node``'s :class:`NodeCollector`."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(NodeCollector(node, queries))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    """``registry``'s families in the Prometheus text format (:data:`CONTENT_TYPE`)."""
    return generate_latest(registry)
