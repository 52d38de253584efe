// het's native core as one Python extension module: the operators of the files beside this one.
#include <torch/csrc/utils/pybind.h>

#include "key_index.h"
#include "ops.h"
#include "window.h"

// A client's hot requests and replies, each in one call (hot.cpp)
pybind11::object hot_reply(pybind11::list frames, int64_t op, uint64_t rid, int64_t n, int64_t dim);
pybind11::tuple narrow_ints(torch::Tensor values, int64_t narrowest);
pybind11::object hot_head(int64_t op, uint64_t rid, const std::string& head, pybind11::list arrays);
pybind11::object hot_request(pybind11::list frames, const std::string& nonce, int64_t max_step, int64_t max_bytes);

// A shard's hot request's keys and counts, read as they travel (wire_keys.cpp)
pybind11::object wire_rows(torch::Tensor keys, int64_t rows, int64_t shards, int64_t index);
pybind11::object wire_counts(torch::Tensor counts, int64_t most);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "het's native core: the hot paths of the worker cache, the shard and the client, each in one pass";
  m.attr("SOURCE_HASH") = HET_SOURCE_HASH;
  m.def("cache_sets", &cache_sets);
  m.def("cache_lookup", &cache_lookup);
  m.def("cache_fill", &cache_fill);
  m.def("cache_update", &cache_update);
  m.def("initial_rows", &initial_rows);
  m.def("lazy_reply", &lazy_reply);
  m.def("unique_inverse", &unique_inverse);
  m.def("table_push", &table_push);
  m.def("adam_steps", &adam_steps);
  m.def("table_push_half", &table_push_half);
  m.def("chunk_push", &chunk_push);
  m.def("gather_rows", &gather_rows);
  m.def("gather_touched", &gather_touched);
  m.def("pull_touched", &pull_touched);
  m.def("shard_order", &shard_order);
  m.def("scatter_rows", &scatter_rows);
  m.def("chunk_gather", &chunk_gather);
  m.def("chunk_scatter", &chunk_scatter);
  m.def("round_rows", &round_rows);
  m.def("refused_value", &refused_value);
  m.def("read_records", &read_records, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("cache_soon", &cache_soon);
  m.def("all_finite", &all_finite_op);
  m.def("index_lookup", &index_lookup);
  m.def("hot_reply", &hot_reply);
  m.def("narrow_ints", &narrow_ints);
  m.def("hot_head", &hot_head);
  m.def("hot_request", &hot_request);
  m.def("wire_rows", &wire_rows);
  m.def("wire_counts", &wire_counts);
  pybind11::class_<Window>(m, "Window")
      .def(pybind11::init<>())
      .def("announce", &Window::announce)
      .def("forget", &Window::forget)
      .def("next_use", &Window::next_use)
      .def("clear", &Window::clear)
      .def("__len__", &Window::size);
  pybind11::class_<KeyIndex>(m, "KeyIndex")
      .def(pybind11::init<>())
      .def("lookup", &KeyIndex::lookup)
      .def("insert", &KeyIndex::insert)
      .def("remove", &KeyIndex::remove)
      .def("keys_of", &KeyIndex::keys_of)
      .def("items", &KeyIndex::items)
      .def("buckets", &KeyIndex::buckets)
      .def("deleted", &KeyIndex::deleted)
      .def("rebuilds", &KeyIndex::rebuilds)
      .def("nbytes", &KeyIndex::nbytes)
      .def("__len__", &KeyIndex::size);
}
