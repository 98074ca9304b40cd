"""The node table (server_app/strategies/node_table.py `NodeTable`): a strategy's nodes and who may join, on
hand-made entries and a grid that only lists node ids. No strategy, no messages."""

from __future__ import annotations

from server_app.strategies.node_table import NodeInfo, NodeTable

HANDSHAKE = [NodeInfo(node_id=12, partition_id=1, num_train_examples=50, name="site-b"),
             NodeInfo(node_id=11, partition_id=0, num_train_examples=40)]


class IdsGrid:
    """The one grid call the table makes: the connected node ids."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def get_node_ids(self) -> list[int]:
        return list(self.ids)


def test_entries_are_in_partition_order_and_found_by_node_id():
    table = NodeTable(HANDSHAKE)
    assert [n.partition_id for n in table.nodes] == [0, 1] and table.from_handshake
    assert table.of(12).name == "site-b" and table.of(99) is None
    assert [table.label(0), table.label(1)] == ["partition-0", "site-b"]  # its name, else its partition


def test_without_a_handshake_the_grids_ids_are_numbered_on_and_keep_their_partition():
    table = NodeTable()
    assert not table.from_handshake and table.nodes == []
    assert table.grow([30, 20]) == 2
    assert [(n.node_id, n.partition_id) for n in table.nodes] == [(20, 0), (30, 1)]
    assert table.grow([30, 25]) == 1  # a node that left keeps its entry; a new id goes after the highest partition
    assert [(n.node_id, n.partition_id) for n in table.nodes] == [(20, 0), (30, 1), (25, 2)]
    assert table.connected([25, 20]) == [table.nodes[0], table.nodes[2]]


def test_a_restarted_node_takes_its_old_entry_and_a_late_site_its_own():
    table = NodeTable(HANDSHAKE)
    asked = []

    def rejoin(grid, new_ids, entries, away):
        asked.append((new_ids, away))
        return {21: NodeInfo(node_id=12, partition_id=1, num_train_examples=50, name="site-b"),  # 12 restarted
                22: NodeInfo(node_id=22, partition_id=2, num_train_examples=30)}                  # a new site

    table.rejoin = rejoin
    assert table.take_in_joined(IdsGrid([11, 21, 22, 23]), next_round=4)
    assert asked == [([21, 22, 23], {12})]
    assert [(n.node_id, n.partition_id) for n in table.nodes] == [(11, 0), (21, 1), (22, 2)]
    assert table.of(21).num_train_examples == 50  # the handshake's count stays: a restart cannot raise it
    assert table.refused == {23}  # unanswered: not asked again
    assert not table.take_in_joined(IdsGrid([11, 21, 22, 23]), next_round=5) and len(asked) == 1


def test_an_algorithm_that_refuses_late_sites_keeps_its_table_and_refuses_them_once():
    table = NodeTable(HANDSHAKE, late_join_refusal=lambda: "the relay's graph is fixed")
    table.rejoin = lambda grid, new_ids, entries, away: {n: NodeInfo(node_id=n, partition_id=5) for n in new_ids}
    assert table.late_join_refusal() == "the relay's graph is fixed"
    assert not table.take_in_joined(IdsGrid([11, 12, 40]), next_round=2)
    assert [n.node_id for n in table.nodes] == [11, 12] and table.refused == {40}


def test_refused_ids_and_a_table_without_a_question_take_no_one_in():
    table = NodeTable(HANDSHAKE)
    assert NodeTable().late_join_refusal() is None  # by default a late site takes part
    assert not table.take_in_joined(IdsGrid([11, 12, 50]), next_round=1)  # no rejoin question: nobody is asked
    table.refuse([50])
    table.rejoin = lambda grid, new_ids, entries, away: {n: NodeInfo(node_id=n, partition_id=7) for n in new_ids}
    assert not table.take_in_joined(IdsGrid([11, 12, 50]), next_round=1) and len(table.nodes) == 2
