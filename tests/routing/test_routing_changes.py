"""Changes that move users go through transit, so between any two consecutive epochs
no user changes owner directly: a gateway on epoch N and another on N+1 can never
send one user to two shards (seed invariant 1). Checked over random sequences of
joins, drains, waves, pins, returns and cut-overs, and on the exact steps of a
scale-out and a scale-in."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.routing.core.hrw import rendezvous_owner
from services.routing.core.routing_changes import (
    first_document,
    with_cluster_draining,
    with_cluster_joining,
    with_cut_over,
    with_cut_over_done,
    with_cut_over_undone,
    with_drain_cancelled,
    with_held,
    with_in_transit,
    with_landed,
    with_pin_in_place,
    with_returned,
    with_transit_ended,
    without_receiving_cluster,
)
from services.routing.core.routing_document import (
    ClusterState,
    RoutingDocument,
    RoutingDocumentError,
)

USERS = range(1, 401)


def _assert_no_direct_handover(before: RoutingDocument, after: RoutingDocument) -> None:
    assert after.epoch == before.epoch + 1
    for user in USERS:
        old, new = before.owner_of(user), after.owner_of(user)
        assert old is None or new is None or old == new, (user, old, new, after.to_json())


def test_a_scale_out_moves_exactly_the_users_the_hash_gives_the_new_cluster() -> None:
    steps = [first_document(["a", "b"])]
    steps.append(with_cluster_joining(steps[-1], "c"))
    resident = [u for u in USERS if rendezvous_owner(u, ["a", "b", "c"]) == "c"][:10]
    steps.append(with_in_transit(steps[-1], dict.fromkeys(resident, "c")))  # one wave
    steps.append(with_landed(steps[-1], resident))
    assert all(steps[-1].owner_of(u) == "c" for u in resident)
    steps.append(with_cut_over(steps[-1], "c"))
    steps.append(with_cut_over_done(steps[-1], "c"))
    for before, after in itertools.pairwise(steps):
        _assert_no_direct_handover(before, after)
    final = steps[-1]
    assert not final.moves and not final.transit  # the wave's moves are the hash's now
    moved = [u for u in USERS if steps[0].owner_of(u) != final.owner_of(u)]
    assert moved == [u for u in USERS if final.owner_of(u) == "c"]
    assert 0.25 < len(moved) / len(USERS) < 0.42


def test_a_scale_in_moves_only_the_leaving_clusters_users() -> None:
    steps = [first_document(["a", "b", "c"])]
    steps.append(with_cluster_draining(steps[-1], "c"))
    theirs = [u for u in USERS if steps[-1].owner_of(u) == "c"]
    wave = {u: rendezvous_owner(u, ["a", "b"]) for u in theirs[:5]}
    steps.append(with_in_transit(steps[-1], wave))
    steps.append(with_landed(steps[-1], [theirs[0], theirs[1]]))
    steps.append(with_returned(steps[-1], theirs[2:5]))  # back to c, by hash: no entry
    assert all(steps[-1].owner_of(u) == "c" for u in theirs[2:5])
    steps.append(with_cut_over(steps[-1], "c"))
    steps.append(with_cut_over_done(steps[-1], "c"))
    for before, after in itertools.pairwise(steps):
        _assert_no_direct_handover(before, after)
    final = steps[-1]
    assert [c.cluster_id for c in final.clusters] == ["a", "b"]
    assert [u for u in USERS if steps[0].owner_of(u) != final.owner_of(u)] == theirs


def test_a_pin_and_an_unpin_move_one_user_and_a_return_restores_the_pin() -> None:
    start = first_document(["a", "b"])
    whale = next(u for u in USERS if start.owner_of(u) == "a")
    going = with_in_transit(start, {whale: "b"}, pin=True)
    pinned = with_landed(going, [whale])
    assert pinned.pins == {whale: "b"} and not pinned.moves
    unpinning = with_in_transit(pinned, {whale: "a"})
    assert with_returned(unpinning, [whale]).pins == {whale: "b"}
    unpinned = with_landed(unpinning, [whale])
    assert not unpinned.pins and not unpinned.moves  # the hash gives it to a again
    for before, after in ((start, going), (going, pinned), (pinned, unpinning)):
        _assert_no_direct_handover(before, after)
    _assert_no_direct_handover(unpinning, unpinned)
    assert all(start.owner_of(u) == unpinned.owner_of(u) for u in USERS)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: with_in_transit(d, {1: d.owner_of(1) or ""}), "already"),
        (lambda d: with_landed(d, [1]), "not in transit"),
        (lambda d: with_cut_over(d, "a"), "only a receiving or a draining one"),
        (lambda d: with_cut_over_done(d, "a"), "no cut-over of it"),
        (lambda d: with_cut_over(d, "zz"), "no cluster zz"),
    ],
)
def test_a_change_that_cannot_be_made_is_refused(change: object, message: str) -> None:
    with pytest.raises(RoutingDocumentError, match=message):
        change(first_document(["a", "b"]))  # type: ignore[operator]


def test_a_departing_cluster_still_holding_users_is_not_removed() -> None:
    document = with_cluster_draining(first_document(["a", "b", "c"]), "c")
    user = next(u for u in USERS if document.owner_of(u) == "c")
    document = with_in_transit(document, {user: "a"})
    document = with_cut_over(document, "c")
    with pytest.raises(RoutingDocumentError, match="still holds"):
        with_cut_over_done(document, "c")


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_changes_never_hand_a_user_from_one_owner_to_another(data: st.DataObject) -> None:
    document = first_document(["a", "b"])
    for _ in range(data.draw(st.integers(1, 25))):
        names = [c.cluster_id for c in document.clusters]
        takers = [
            c.cluster_id
            for c in document.clusters
            if c.state not in (ClusterState.DRAINING, ClusterState.DEPARTING)
        ]
        choice = data.draw(st.integers(0, 13))
        try:
            if choice == 0:
                following = with_cluster_joining(document, data.draw(st.sampled_from("abcdef")))
            elif choice == 1:
                following = with_cluster_draining(document, data.draw(st.sampled_from(names)))
            elif choice == 2:
                users = data.draw(st.lists(st.sampled_from(USERS), max_size=5, unique=True))
                following = with_in_transit(
                    document,
                    {u: data.draw(st.sampled_from(takers)) for u in users},
                    pin=data.draw(st.booleans()),
                )
            elif choice in (3, 4) and document.transit:
                users = data.draw(
                    st.lists(st.sampled_from(sorted(document.transit)), min_size=1, unique=True)
                )
                end = with_landed if choice == 3 else with_returned
                following = end(document, users)
            elif choice == 5:
                following = with_cut_over(document, data.draw(st.sampled_from(names)))
            elif choice == 6:
                following = with_cut_over_done(document, data.draw(st.sampled_from(names)))
            elif choice == 7:
                following = with_cut_over_undone(document, data.draw(st.sampled_from(names)))
            elif choice == 8:
                users = data.draw(st.lists(st.sampled_from(USERS), max_size=5, unique=True))
                following = with_held(document, users)
            elif choice == 9 and document.transit:
                users = sorted(document.transit)
                split = data.draw(st.integers(0, len(users)))
                following = with_transit_ended(
                    document, landed=users[:split], returned=users[split:]
                )
            elif choice == 10:
                user = data.draw(st.sampled_from(USERS))
                cluster = data.draw(st.sampled_from([*names, None]))
                following = with_pin_in_place(document, user, cluster)
            elif choice == 11:
                following = without_receiving_cluster(document, data.draw(st.sampled_from(names)))
            elif choice == 12:
                following = with_drain_cancelled(document, data.draw(st.sampled_from(names)))
            else:
                continue
        except RoutingDocumentError:
            continue
        _assert_no_direct_handover(document, following)
        assert RoutingDocument.decode(following.encode()) == following
        document = following


def test_rapid_changes_of_one_user_coalesce_into_the_last() -> None:
    start = first_document(["a", "b", "c"])
    user = next(u for u in USERS if start.owner_of(u) == "a")
    going = with_in_transit(start, {user: "b"}, pin=True)
    retargeted = with_in_transit(going, {user: "c"}, pin=True)  # before it landed
    assert retargeted.transit[user].source == "a" and retargeted.transit[user].destination == "c"
    assert with_landed(retargeted, [user]).pins == {user: "c"}
    with pytest.raises(RoutingDocumentError, match="return it instead"):
        with_in_transit(going, {user: "a"})


def test_a_user_that_will_not_go_flat_is_held_and_a_cut_over_can_be_undone() -> None:
    joining = with_cut_over(with_cluster_joining(first_document(["a", "b"]), "c"), "c")
    stuck = next(u for u in USERS if joining.owner_of(u) is None)
    before = rendezvous_owner(stuck, ["a", "b"])
    held = with_held(joining, [stuck])
    assert held.owner_of(stuck) == before
    _assert_no_direct_handover(joining, held)
    done = with_cut_over_done(held, "c")
    assert done.owner_of(stuck) == before and done.moves == {stuck: before}
    undone = with_cut_over_undone(joining, "c")
    assert undone.cluster("c") is not None and undone.cluster("c").state == ClusterState.RECEIVING  # type: ignore[union-attr]
    assert undone.owner_of(stuck) == before
