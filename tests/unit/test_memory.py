"""Big row arrays on huge pages (het.memory): the same tensors, and the advice taken where
Linux offers transparent huge pages."""

import re
import sys

import pytest
import torch

from het import memory

THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_setting() -> str | None:
    try:
        with open(THP) as f:
            return re.search(r"\[(\w+)\]", f.read()).group(1)
    except (OSError, AttributeError):
        return None


def thp_fallbacks() -> int:
    """Faults the kernel served with small pages where a huge one was asked for (/proc/vmstat)."""
    with open("/proc/vmstat") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("thp_fault_fallback "))


def huge_kib(t: torch.Tensor) -> int:
    """AnonHugePages of the mappings over ``t`` (/proc/self/smaps): the advice splits the
    mapping, so the advised part is a mapping of its own."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                inside = int(m.group(1), 16) < hi and lo < int(m.group(2), 16)
            elif inside and line.startswith("AnonHugePages:"):
                total += int(line.split()[1])
    return total


@pytest.mark.parametrize("make, value", [(memory.zeros, 0.0), (lambda *s, **k: memory.full(s, 1.5, **k), 1.5)])
def test_big_and_small_arrays_are_torchs(make, value):
    for shape in ((3, 4), (70_000, 64)):  # 1 KiB and 17.5 MiB
        t = make(*shape, dtype=torch.float32)
        assert t.shape == shape and t.dtype == torch.float32 and t.is_contiguous()
        assert bool((t == value).all())
    assert memory.empty(5, dtype=torch.int64).dtype == torch.int64


@pytest.mark.skipif(not sys.platform.startswith("linux") or thp_setting() in (None, "never"),
                    reason="no transparent huge pages here")
def test_a_big_array_is_advised_onto_huge_pages(monkeypatch):
    fell_back = thp_fallbacks()
    t = memory.zeros(40 << 20 >> 2)  # 40 MiB
    assert memory.advise(t)  # the kernel takes the advice
    if huge_kib(t) == 0 and thp_fallbacks() > fell_back:
        pytest.skip("the kernel had no free huge page to give (thp_fault_fallback rose): memory is fragmented")
    assert huge_kib(t) > 0, "the kernel took the advice but backed none of the array with huge pages"
    monkeypatch.setenv(memory.ENV, "0")
    assert not memory.advise(memory.empty(40 << 20 >> 2))


def test_an_array_smaller_than_a_huge_page_is_not_advised():
    """No whole 2 MiB page inside it: nothing to ask for."""
    assert not memory.advise(torch.empty(1000))
    assert not memory.advise(torch.empty(0))
