"""The routing document: one canonical encoding per document, ownership by pin, then
by wave move, then by hash over the clusters that own by hash, and a specific error
for every malformed or inconsistent document."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.routing.core.hrw import rendezvous_owner
from services.routing.core.routing_document import (
    LEAVING,
    Cluster,
    ClusterState,
    RoutingDocument,
    RoutingDocumentError,
    Transit,
)

ACTIVE, RECEIVING, DRAINING = ClusterState.ACTIVE, ClusterState.RECEIVING, ClusterState.DRAINING
ARRIVING, DEPARTING = ClusterState.ARRIVING, ClusterState.DEPARTING


def _document(**overrides: object) -> RoutingDocument:
    fields: dict[str, object] = {
        "epoch": 7,
        "clusters": [Cluster("c2", ACTIVE), Cluster("c1", ACTIVE), Cluster("c3", RECEIVING)],
        "pins": {42: "c1"},
        "moves": {5: "c3"},
    }
    fields.update(overrides)
    return RoutingDocument.build(**fields)  # type: ignore[arg-type]


def test_the_canonical_encoding_is_published() -> None:
    assert _document().encode() == (
        b'{"clusters":[{"id":"c1","state":"active"},{"id":"c2","state":"active"},'
        b'{"id":"c3","state":"receiving"}],"epoch":7,"moves":{"5":"c3"},"pins":{"42":"c1"}}'
    )


def test_ownership_is_pin_then_move_then_hash_over_active_and_draining() -> None:
    document = _document(
        clusters=[Cluster("c1", ACTIVE), Cluster("c2", DRAINING), Cluster("c3", RECEIVING)]
    )
    assert document.owner_of(42) == "c1"  # pinned (its hash owner among c1, c2 is c1 too)
    assert document.owner_of(5) == "c3"  # moved by a wave to the receiving cluster
    assert document.hash_owners == ("c1", "c2")
    for user_id in range(1, 300):
        if user_id not in (5, 42):
            assert document.owner_of(user_id) == rendezvous_owner(user_id, ["c1", "c2"])
            assert document.owner_of(user_id) != "c3"  # receiving: nobody by hash


_cluster_ids = st.lists(st.from_regex(r"c[0-9]{1,3}", fullmatch=True), min_size=1, unique=True)


@st.composite
def _documents(draw: st.DrawFn) -> RoutingDocument:
    ids = draw(_cluster_ids)
    states = [ACTIVE] + [draw(st.sampled_from(list(ClusterState))) for _ in ids[1:]]
    clusters = [Cluster(cluster_id, state) for cluster_id, state in zip(ids, states, strict=True)]
    takers = [c.cluster_id for c in clusters if c.state not in LEAVING]
    users = draw(st.lists(st.integers(1, 10**12), unique=True, max_size=21))
    third = len(users) // 3
    pins = {user: draw(st.sampled_from(takers)) for user in users[:third]}
    moves = {user: draw(st.sampled_from(takers)) for user in users[third : 2 * third]}
    transit = {}
    if len(ids) > 1:
        for user in users[2 * third :]:
            destination = draw(st.sampled_from(takers))
            source = draw(st.sampled_from([c for c in ids if c != destination]))
            transit[user] = Transit(source, destination, draw(st.booleans()), draw(st.booleans()))
    return RoutingDocument.build(draw(st.integers(1, 2**40)), clusters, pins, moves, transit)


@given(_documents())
def test_decode_inverts_encode_and_the_bytes_are_one_per_document(
    document: RoutingDocument,
) -> None:
    decoded = RoutingDocument.decode(document.encode())
    assert decoded == document
    assert decoded.encode() == document.encode()
    for user_id in (*document.pins, *document.moves, *document.transit, 1, 2, 3):
        assert decoded.owner_of(user_id) == document.owner_of(user_id)
    for user_id in document.transit:
        assert document.owner_of(user_id) is None


def test_a_cut_over_puts_in_transit_exactly_the_users_the_hash_moves() -> None:
    """Joining: the users hashing to the arriving cluster are owned by nobody for the
    cut-over epoch; leaving: the users hashing to the departing one are. Everyone else
    keeps its owner, and nobody is ever owned by a cluster the hash does not pick."""
    users = range(1, 3001)
    arriving = RoutingDocument.build(
        3, [Cluster("c1", ACTIVE), Cluster("c2", ACTIVE), Cluster("c3", ARRIVING)]
    )
    departing = RoutingDocument.build(
        3, [Cluster("c1", ACTIVE), Cluster("c2", ACTIVE), Cluster("c3", DEPARTING)]
    )
    for user in users:
        two, three = (
            rendezvous_owner(user, ["c1", "c2"]),
            rendezvous_owner(user, ["c1", "c2", "c3"]),
        )
        assert arriving.owner_of(user) == (two if three == two else None)
        assert arriving.hash_owner_after(user) == three
        assert departing.owner_of(user) == (three if three == two else None)
        assert departing.hash_owner_after(user) == two
    moved = sum(arriving.owner_of(user) is None for user in users)
    assert 800 < moved < 1200  # about a third


def test_transit_is_encoded_only_when_there_is_some() -> None:
    document = _document(moves={}, transit={9: Transit("c2", "c3", False, True)})
    assert document.encode().endswith(
        b'"transit":{"9":{"from":"c2","pin":true,"pinned":false,"to":"c3"}}}'
    )
    assert b"transit" not in _document().encode()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "not JSON"),
        (b"[]", "a JSON object"),
        (b'{"epoch":1,"clusters":[],"extra":1}', "unknown field"),
        (b'{"epoch":"1","clusters":[]}', "epoch: an integer"),
        (b'{"epoch":0,"clusters":[{"id":"c1","state":"active"}]}', "epochs start at 1"),
        (b'{"epoch":1,"clusters":[{"id":"c1","state":"busy"}]}', "not one of"),
        (b'{"epoch":1,"clusters":[{"id":"C1","state":"active"}]}', "a DNS label"),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"},{"id":"c1","state":"active"}]}',
            "listed twice",
        ),
        (b'{"epoch":1,"clusters":[{"id":"c1","state":"receiving"}]}', "no active cluster"),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"}],"pins":{"7":"c9"}}',
            "no cluster 'c9'",
        ),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"}],"pins":{"x":"c1"}}',
            "is not user -> cluster",
        ),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"},'
            b'{"id":"c2","state":"draining"}],"moves":{"7":"c2"}}',
            "a draining cluster takes no users",
        ),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"}],'
            b'"pins":{"7":"c1"},"moves":{"7":"c1"}}',
            "in both pins and moves",
        ),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"},'
            b'{"id":"c2","state":"departing"}],'
            b'"transit":{"7":{"from":"c1","to":"c2","pinned":false,"pin":false}}}',
            "a departing cluster takes no users",
        ),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"}],'
            b'"transit":{"7":{"from":"c1","to":"c1","pinned":false,"pin":false}}}',
            "from and to are both c1",
        ),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"}],'
            b'"transit":{"7":{"from":"c1","to":"c9","pinned":false,"pin":false}}}',
            "no cluster 'c9' \\(to\\)",
        ),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"}],'
            b'"transit":{"7":{"from":"c1","to":"c2"}}}',
            "is not user -> {from, to, pinned, pin}",
        ),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"},{"id":"c2","state":"active"}],'
            b'"moves":{"7":"c1"},"transit":{"7":{"from":"c1","to":"c2","pinned":false,"pin":false}}}',
            "in both moves and transit",
        ),
        (
            b'{"epoch":1,"clusters":[{"id":"c1","state":"active"}],"pins":{"0":"c1"}}',
            "user ids start at 1",
        ),
    ],
)
def test_a_bad_document_is_refused_with_what_is_wrong(raw: bytes, message: str) -> None:
    with pytest.raises(RoutingDocumentError, match=message):
        RoutingDocument.decode(raw)
