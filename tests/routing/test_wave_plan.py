"""The wave controller's choices (`services/routing/core/wave_plan.py`), which the real
controller and the simulation's share: who moves at a scale-out and a scale-in, in
which waves, and who is stuck at a cut-over."""

from __future__ import annotations

from services.routing.core.hrw import rendezvous_owner
from services.routing.core.routing_changes import (
    first_document,
    with_cluster_draining,
    with_cluster_joining,
    with_cut_over,
    with_in_transit,
    with_landed,
)
from services.routing.core.wave_plan import (
    arrivals,
    departures,
    homes_without,
    moved_to,
    owned_by_hash,
    still_to_move,
    stuck_at_cut_over,
    waves_of,
)

USERS = range(1, 201)


def test_a_scale_out_moves_the_residents_the_hash_gives_the_new_group_and_no_other() -> None:
    document = with_cluster_joining(first_document(["a", "b"]), "c")
    elsewhere = "b" if document.owner_of(7) == "a" else "a"
    moved_away = with_landed(with_in_transit(document, {7: elsewhere}), [7])
    residents = {
        owner: [u for u in USERS if moved_away.owner_of(u) == owner] for owner in ("a", "b")
    }
    movers = arrivals(moved_away, residents, "c")
    expected = {u for u in USERS if u != 7 and rendezvous_owner(u, ("a", "b", "c")) == "c"}
    assert set(movers) == expected and set(movers.values()) == {"c"}
    assert 7 not in movers  # a moved user stays where it was moved
    assert not owned_by_hash(moved_away, 7) and owned_by_hash(moved_away, 8)
    # Only residents are listed: idle users move lazily, their state is in PostgreSQL.
    assert arrivals(moved_away, {"a": [], "b": []}, "c") == {}


def test_a_scale_in_sends_the_leaving_groups_users_where_the_hash_puts_them_without_it() -> None:
    document = with_cluster_draining(first_document(["a", "b", "c"]), "c")
    owned = [u for u in USERS if document.owner_of(u) == "c"]
    not_its_own = next(u for u in USERS if document.owner_of(u) == "a")  # held, leaving
    movers = departures(document, [*owned, not_its_own], "c")
    assert sorted(movers) == owned
    for user, home in movers.items():
        assert home == rendezvous_owner(user, ("a", "b"))
    assert homes_without(document, [5], "c") == {5: rendezvous_owner(5, ("a", "b"))}


def test_users_moved_to_a_group_are_listed_for_sending_home() -> None:
    document = first_document(["a", "b"])
    user = next(u for u in USERS if document.owner_of(u) == "a")
    moved = with_landed(with_in_transit(document, {user: "b"}), [user])
    assert moved_to(moved, "b") == [user] and moved_to(moved, "a") == []


def test_waves_are_sized_and_redecided_on_the_document_of_now() -> None:
    document = first_document(["a", "b"])
    movers = {u: "b" for u in USERS if document.owner_of(u) == "a"}
    waves = waves_of(movers, 16)
    assert [len(w) for w in waves[:-1]] == [16] * (len(waves) - 1) and len(waves[-1]) <= 16
    assert [u for w in waves for u in w] == sorted(movers)
    first = waves[0]
    in_transit = with_in_transit(document, {first[0]: "b"})  # meanwhile, by another move
    assert still_to_move(in_transit, first, movers) == first[1:]


def test_a_cut_over_finds_stuck_the_residents_its_epoch_left_ownerless() -> None:
    document = with_cut_over(with_cluster_joining(first_document(["a", "b"]), "c"), "c")
    residents_of_a = [u for u in USERS if rendezvous_owner(u, ("a", "b")) == "a"]
    stuck = stuck_at_cut_over(document, residents_of_a)
    assert stuck == [u for u in residents_of_a if rendezvous_owner(u, ("a", "b", "c")) == "c"]
    waved = with_in_transit(document, {residents_of_a[0]: "b"})
    if residents_of_a[0] not in stuck:  # a wave's transit is not the cut-over's
        assert residents_of_a[0] not in stuck_at_cut_over(waved, residents_of_a)
