"""Rendezvous hashing: the published test vectors, and the properties scaling relies on
(each user has one owner, a new cluster takes about 1/N of the users and only for
itself, removing a cluster moves only its own users)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.routing.core.hrw import NoClusterError, rendezvous_owner, score

ROOT = Path(__file__).resolve().parents[2]

# The README's test vectors: score = first 8 bytes, big-endian, of SHA-256("<cluster>/<user>").
SCORES = [
    ("c1", 1, 0xCBE81B05D5870AF7),
    ("c2", 1, 0xCD232ABBBECB6AFC),
    ("c3", 1, 0x468DD558585E26C6),
    ("c1", 42, 0xA261DE88011E83BA),
    ("c2", 42, 0x5B0D9928372EAAA1),
    ("c3", 42, 0xD43FEC5E68C09781),
]
OWNERS = [  # user, owner among c1..c2, owner among c1..c3
    (1, "c2", "c2"),
    (2, "c2", "c3"),
    (3, "c2", "c2"),
    (42, "c1", "c3"),
    (1000003, "c2", "c3"),
]


@pytest.mark.parametrize(("cluster_id", "user_id", "expected"), SCORES)
def test_scores_are_the_published_vectors(cluster_id: str, user_id: int, expected: int) -> None:
    assert score(cluster_id, user_id) == expected


@pytest.mark.parametrize(("user_id", "of_two", "of_three"), OWNERS)
def test_owners_are_the_published_vectors(user_id: int, of_two: str, of_three: str) -> None:
    assert rendezvous_owner(user_id, ["c1", "c2"]) == of_two
    assert rendezvous_owner(user_id, ["c3", "c2", "c1"]) == of_three  # order does not matter


def test_another_process_with_another_hash_seed_agrees() -> None:
    code = (
        "from services.routing.core.hrw import rendezvous_owner;"
        "print(','.join(rendezvous_owner(u, ['c1', 'c2', 'c3']) for u in range(1, 200)))"
    )
    answers = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(answers) == 1
    expected = ",".join(rendezvous_owner(u, ["c1", "c2", "c3"]) for u in range(1, 200))
    assert answers == {expected + "\n"}


def test_no_cluster_owns_nobody() -> None:
    with pytest.raises(NoClusterError):
        rendezvous_owner(1, [])


def test_a_new_cluster_takes_about_a_third_and_only_for_itself() -> None:
    users = range(1, 30_001)
    before = {user: rendezvous_owner(user, ["c1", "c2"]) for user in users}
    after = {user: rendezvous_owner(user, ["c1", "c2", "c3"]) for user in users}
    moved = [user for user in users if before[user] != after[user]]
    assert all(after[user] == "c3" for user in moved)
    assert 0.31 < len(moved) / len(users) < 0.36, len(moved)
    counts = {cluster: list(after.values()).count(cluster) for cluster in ("c1", "c2", "c3")}
    assert all(9_400 < count < 10_600 for count in counts.values()), counts


@given(
    st.lists(st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True), min_size=2, unique=True),
    st.integers(min_value=1, max_value=2**63),
)
def test_removing_a_cluster_moves_only_its_own_users(clusters: list[str], user_id: int) -> None:
    owner = rendezvous_owner(user_id, clusters)
    for removed in clusters:
        rest = [cluster for cluster in clusters if cluster != removed]
        if removed != owner:
            assert rendezvous_owner(user_id, rest) == owner
