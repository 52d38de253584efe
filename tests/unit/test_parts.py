"""A push in parts (het.ps.server.parts): held until its last part, joined in order; a part out of
order or unlike those before it refused with the push held so far; a bounded number held."""

import numpy as np
import pytest
import torch

from het.ps.server.parts import MAX_HELD, Checked, Parts


def part(keys, table="t", step=1) -> Checked:
    return Checked(table, step, torch.tensor(keys), np.ones((len(keys), 2), np.float32), np.ones(len(keys), np.int64),
                   None)


def test_parts_are_joined_in_order_at_the_last():
    held = Parts()
    assert held.add("s", (1, 3), part([5])) is None and held.add("s", (2, 3), part([1, 2])) is None
    whole = held.add("s", (3, 3), part([9]))
    assert whole.keys.tolist() == [5, 1, 2, 9] and whole.grads.shape == (4, 2) and held.held == 0


@pytest.mark.parametrize("second, says", [((3, 3), "came after part 1 of 3"),
                                          ((2, 4), "came after part 1 of 3")])
def test_a_part_out_of_order_is_refused_with_the_push_held_so_far(second, says):
    held = Parts()
    held.add("s", (1, 3), part([5]))
    with pytest.raises(ValueError, match=says + ".*refused whole"):
        held.add("s", second, part([6]))
    assert held.held == 0
    with pytest.raises(ValueError, match="came without part 1"):
        held.add("s", (2, 3), part([6]))


def test_a_part_for_another_table_or_step_is_refused():
    held = Parts()
    held.add("s", (1, 2), part([5]))
    with pytest.raises(ValueError, match="is for table 'u', step 1"):
        held.add("s", (2, 2), part([6], table="u"))


def test_at_most_max_held_pushes_are_held_the_oldest_goes():
    held = Parts()
    for i in range(MAX_HELD + 1):
        held.add(f"s{i}", (1, 2), part([i]))
    assert held.held == MAX_HELD
    with pytest.raises(ValueError, match="came without part 1"):
        held.add("s0", (2, 2), part([0]))
    assert held.add(f"s{MAX_HELD}", (2, 2), part([1])).keys.tolist() == [MAX_HELD, 1]
