"""Synthetic Criteo-like data and the Batch it produces."""

import math
import tracemalloc

import numpy as np
import pytest
import torch

from het.data.batch import Batch
from het.data.synthetic import CRITEO_CARDINALITIES, SyntheticCriteo, SyntheticCriteoConfig


@pytest.fixture(scope="module")
def data():
    return SyntheticCriteo(SyntheticCriteoConfig())


@pytest.fixture(scope="module")
def train50k(data):
    """About 50k train samples (6 batches of 8192) as one Batch."""
    return Batch.cat([data.batch("train", i, 8192) for i in range(6)])


def assert_batches_equal(a: Batch, b: Batch):
    assert torch.equal(a.dense, b.dense) and torch.equal(a.sparse, b.sparse)
    assert torch.equal(a.labels, b.labels)


# ---- layout ---------------------------------------------------------------------------------

def test_criteo_has_26_fields_with_33_762_577_ids():
    assert len(CRITEO_CARDINALITIES) == 26
    assert sum(CRITEO_CARDINALITIES) == 33_762_577


def test_offsets_give_every_field_its_own_range_of_one_table(data):
    cards = np.array(data.cardinalities)
    assert data.cardinalities == CRITEO_CARDINALITIES
    assert data.offsets.dtype == np.int64 and data.offsets.shape == (26,)
    assert data.offsets[0] == 0
    assert np.array_equal(data.offsets[1:], data.offsets[:-1] + cards[:-1])  # contiguous, disjoint
    assert data.num_rows == 33_762_577 == data.offsets[-1] + cards[-1]
    assert (data.num_dense, data.num_fields) == (13, 26)


def test_keys_lie_in_their_fields_range(data, train50k):
    keys = train50k.sparse.numpy()
    assert keys.dtype == np.int64 and keys.shape == (len(train50k), 26)
    assert (keys >= data.offsets).all()
    assert (keys < data.offsets + np.array(data.cardinalities)).all()
    assert (keys < data.num_rows).all()


def test_cap_and_scale_change_cardinalities_as_documented():
    capped = SyntheticCriteoConfig(cap=1000).cardinalities()
    assert capped == tuple(min(c, 1000) for c in CRITEO_CARDINALITIES)
    assert SyntheticCriteoConfig(scale=0.5).cardinalities() == tuple(
        max(1, round(c * 0.5)) for c in CRITEO_CARDINALITIES)
    tiny = SyntheticCriteoConfig(scale=1e-9).cardinalities()
    assert tiny == (1,) * 26  # at least one id a field
    # scale first, then cap: 3 * 2 = 6 ids survives a cap of 10, 2 * 1460 does not
    both = SyntheticCriteoConfig(scale=2, cap=10).cardinalities()
    assert both[8] == 6 and both[0] == 10


def test_a_capped_generator_draws_keys_inside_the_capped_fields():
    data = SyntheticCriteo(SyntheticCriteoConfig(cap=100))
    assert data.num_rows == sum(min(c, 100) for c in CRITEO_CARDINALITIES)
    keys = data.batch("train", 0, 4096).sparse.numpy()
    assert (keys >= data.offsets).all() and (keys < data.offsets + np.array(data.cardinalities)).all()
    # small fields get every id hit: the power law covers the whole range, not a prefix
    assert len(np.unique(keys[:, 8])) == 3


# ---- determinism ----------------------------------------------------------------------------

def test_same_arguments_give_the_same_batch(data):
    assert_batches_equal(data.batch("train", 5, 1000), data.batch("train", 5, 1000))
    fresh = SyntheticCriteo(SyntheticCriteoConfig())
    assert_batches_equal(data.batch("test", 2, 300), fresh.batch("test", 2, 300))


def test_other_index_split_or_seed_gives_other_samples(data):
    base = data.batch("train", 0, 1000)
    for other in (data.batch("train", 1, 1000), data.batch("test", 0, 1000),
                  SyntheticCriteo(SyntheticCriteoConfig(seed=1)).batch("train", 0, 1000)):
        assert not torch.equal(base.sparse, other.sparse)
        assert not torch.equal(base.dense, other.dense)


def test_key_weights_are_a_pure_standard_normal_function_of_seed_and_key(data):
    keys = np.arange(0, data.num_rows, 97, dtype=np.int64)  # ~350k keys spread over the table
    w = data.key_weights(keys)
    assert np.array_equal(w, SyntheticCriteo(SyntheticCriteoConfig()).key_weights(keys))
    assert np.array_equal(w[::-1], data.key_weights(keys[::-1]))  # per key, not per position
    assert abs(w.mean()) < 0.01 and abs(w.std() - 1) < 0.01
    other = SyntheticCriteo(SyntheticCriteoConfig(seed=1)).key_weights(keys)
    assert abs(np.corrcoef(w, other)[0, 1]) < 0.01


# ---- distributions --------------------------------------------------------------------------

def test_dense_features_are_finite_non_negative_float32(train50k):
    dense = train50k.dense
    assert dense.dtype == torch.float32 and dense.shape == (len(train50k), 13)
    assert torch.isfinite(dense).all() and (dense >= 0).all()
    assert (dense.std(0) > 0.1).all()  # every feature varies
    # log(x + 1) of integer counts: exp(d) - 1 is an integer
    counts = torch.expm1(dense.double())
    assert ((counts - counts.round()).abs() <= 1e-5 * (counts + 1)).all()


@pytest.mark.parametrize("rate", [0.25, 0.1])
def test_positive_rate_is_on_target(rate, train50k):
    if rate == 0.25:
        labels = train50k.labels
    else:
        data = SyntheticCriteo(SyntheticCriteoConfig(positive_rate=rate))
        labels = torch.cat([data.batch("train", i, 8192).labels for i in range(6)])
    assert set(labels.unique().tolist()) == {0.0, 1.0}
    assert abs(labels.mean().item() - rate) < 0.04


def test_keys_follow_a_power_law_with_a_fixed_hot_set(data, train50k):
    field = CRITEO_CARDINALITIES.index(10131227)
    keys = train50k.sparse[:, field].numpy()
    counts = np.sort(np.unique(keys, return_counts=True)[1])[::-1]
    top_tenth = counts[: len(counts) // 10].sum() / counts.sum()
    assert top_tenth > 0.55, f"the hottest 10% of ids seen took only {top_tenth:.2f} of accesses"

    def hottest(batch, k=3):
        ids, c = np.unique(batch.sparse[:, field].numpy(), return_counts=True)
        return set(ids[np.argsort(c)[-k:]].tolist())

    assert hottest(data.batch("train", 0, 8192)) == hottest(data.batch("train", 7, 8192))
    assert hottest(data.batch("train", 0, 8192)) == hottest(data.batch("test", 0, 8192))


def test_alpha_one_uses_the_log_form_and_stays_skewed():
    data = SyntheticCriteo(SyntheticCriteoConfig(alpha=1.0, cap=1000))
    keys = data.batch("train", 0, 20_000).sparse[:, 2].numpy()
    counts = np.sort(np.bincount(keys - data.offsets[2]))[::-1]
    assert counts.sum() == 20_000 and counts[0] > 10 * counts[100]


def test_planted_auc_is_a_meaningful_ceiling(data):
    assert 0.7 < data.planted_auc() < 0.95
    weak = SyntheticCriteo(SyntheticCriteoConfig(signal=0.0)).planted_auc(samples=20_000)
    assert abs(weak - 0.5) < 0.03  # no signal, no AUC


def test_labels_are_drawn_from_the_planted_logits(data):
    b = data.batch("test", 0, 8192)
    logits = data.planted_logits(b.sparse, b.dense)
    assert np.array_equal(logits, data.planted_logits(b.sparse.numpy(), b.dense.numpy()))
    p = 1 / (1 + np.exp(-logits))
    assert abs(p.mean() - b.labels.mean().item()) < 0.02  # calibrated: E[label] = E[sigmoid]


def test_a_batch_allocates_nothing_proportional_to_the_cardinalities(data):
    tracemalloc.start()
    data.batch("train", 0, 8192)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # about 12 MiB of (8192, 26) temporaries; one int64 per id of the largest field is 77 MiB
    assert peak < 32 * 2**20, f"batch of 8192 peaked at {peak / 2**20:.1f} MiB"


# ---- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"alpha": -1}, "alpha must be a finite number > 0, got -1"),
    ({"alpha": math.nan}, "alpha .* got nan"),
    ({"cap": 0}, "cap must be None or an int >= 1, got 0"),
    ({"cap": 2.5}, "cap .* got 2.5"),
    ({"scale": 0}, "scale must be a finite number > 0, got 0"),
    ({"seed": -3}, "seed must be an int >= 0, got -3"),
    ({"positive_rate": 1.0}, r"positive_rate must lie in \(0, 1\), got 1.0"),
    ({"signal": -0.5}, "signal must be a finite number >= 0, got -0.5"),
    ({"scale": 1000}, "cardinality must be < 2147483648 .* got 10131227000"),
])
def test_bad_config_values_raise_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SyntheticCriteoConfig(**kwargs)


@pytest.mark.parametrize("args, message", [
    (("valid", 0, 8), "split must be one of .* got 'valid'"),
    (("train", -1, 8), "index must be an int >= 0, got -1"),
    (("train", 0, 0), "size must be an int >= 1, got 0"),
])
def test_bad_batch_arguments_raise(data, args, message):
    with pytest.raises(ValueError, match=message):
        data.batch(*args)


def test_planted_logits_check_their_inputs(data):
    b = data.batch("train", 0, 4)
    with pytest.raises(ValueError, match=r"expected sparse keys of shape \(B, 26\), got \(4, 25\)"):
        data.planted_logits(b.sparse[:, :25], b.dense)
    with pytest.raises(ValueError, match=r"keys must lie in \[0, 33762577\)"):
        data.planted_logits(b.sparse + data.num_rows, b.dense)


# ---- Batch ----------------------------------------------------------------------------------

def test_batch_len_to_and_cat(data):
    a, b = data.batch("train", 0, 3), data.batch("train", 1, 5)
    both = Batch.cat([a, b])
    assert len(both) == 8 and torch.equal(both.sparse[3:], b.sparse)
    moved = a.to("cpu")
    assert moved is not a and torch.equal(moved.dense, a.dense)
    with pytest.raises(ValueError, match="at least one Batch"):
        Batch.cat([])


def test_batch_rejects_mismatched_rows_and_dtypes():
    with pytest.raises(ValueError, match=r"same number of rows, got \(2, 2, 3\)"):
        Batch(torch.zeros(2, 13), torch.zeros(2, 26, dtype=torch.int64), torch.zeros(3))
    with pytest.raises(ValueError, match="sparse must be a 2-D torch.int64 tensor, got 2-D torch.int32"):
        Batch(torch.zeros(2, 13), torch.zeros(2, 26, dtype=torch.int32), torch.zeros(2))
