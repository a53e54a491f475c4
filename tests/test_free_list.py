"""`FreeList` against its oracle: a Python list where a free appends and a take pops the front.

That list is exactly what cat-on-free pools did, so the pools' hand-out order is unchanged.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from impl.free_list import FreeList

operations = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.integers(0, 6)),
        st.tuples(st.just("put"), st.lists(st.integers(0, 99), max_size=4)),
        st.tuples(st.just("slots"), st.none()),
    ),
    max_size=40,
)


@given(start=st.lists(st.integers(0, 99), max_size=8), ops=operations)
def test_free_list_hands_out_in_the_order_of_a_plain_queue(start, ops):
    free = FreeList(torch.tensor(start, dtype=torch.int64))
    oracle = list(start)
    for op, arg in ops:
        if op == "take":
            got = free.take(arg)
            if arg > len(oracle):
                assert got is None
            else:
                assert got.tolist() == oracle[:arg]
                del oracle[:arg]
        elif op == "put":
            free.put(torch.tensor(arg, dtype=torch.int64))
            oracle.extend(arg)
        else:
            assert free.slots().tolist() == oracle
        assert len(free) == len(oracle)


def test_free_list_keeps_a_copy_of_what_it_is_given():
    free = FreeList(torch.empty((0,), dtype=torch.int64))
    returned = torch.tensor([3, 4])
    free.put(returned)
    returned.fill_(0)
    assert free.slots().tolist() == [3, 4]


def test_free_list_vet_refusal_changes_nothing():
    free = FreeList(torch.tensor([1, 2]))
    free.put(torch.tensor([3]))

    def refuse(slots):
        raise ValueError(f"refused {slots.tolist()}")

    with pytest.raises(ValueError, match=r"refused \[1, 2, 3\]"):
        free.take(3, refuse)
    assert len(free) == 3 and free.take(3).tolist() == [1, 2, 3]
