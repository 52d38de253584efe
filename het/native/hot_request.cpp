// A shard's hot request (het/ps/server/hot.py) read in one call: the text het's client writes by
// its short path (het/ps/client/hot.py), field by field in the schema's order (wire.h), or nothing:
// the shard's Python reader then, which reads any spelling.
#include <pybind11/numpy.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "common.h"
#include "hot_text.h"
#include "wire.h"

namespace py = pybind11;
using namespace hot_text;  // NOLINT: the readers of hot_text.h, by name

namespace {

// An array's spec ["code",[sizes]] of `dims` sizes, its code among `codes`: the code's bytes a value.
template <size_t N>
int take_any_spec(std::string_view text, size_t& at, const wire::Code (&codes)[N], int dims, int64_t* sizes) {
  if (!take(text, at, "[\"")) return 0;
  int bytes = 0;
  for (const auto& [code, size] : codes)
    if (text.compare(at, code.size(), code) == 0 && text.compare(at + code.size(), 1, "\"") == 0) {
      at += code.size();
      bytes = size;
      break;
    }
  if (bytes == 0 || !take(text, at, "\",[")) return 0;
  for (int d = 0; d < dims; ++d)
    if ((d && !take(text, at, ",")) || !take_int(text, at, sizes[d])) return 0;
  return take(text, at, "]]") ? bytes : 0;
}

// A hot request's meta fields, read in the order the schema lists them (wire::kPullFields,
// wire::kPushFields) and as het's client writes them; false for any other text, or a field this
// reader does not know (a schema's new field: the Python reader's then).
struct HotMeta {
  std::string_view table, session;
  int64_t step = 0, seq = 0, first = 0;
  bool lazy = false, coded = false;
};

template <size_t N>
bool read_hot_meta(std::string_view meta, size_t& at, const std::string_view (&fields)[N], std::string_view nonce,
                   int64_t max_step, HotMeta& out) {
  for (size_t i = 0; i < N; ++i) {
    const std::string_view name = fields[i];
    if (!take_key(meta, at, name, i == 0)) {
      if (name == "deltas") continue;  // only where the keys travel as steps
      return false;
    }
    std::string_view sent;
    bool ok;
    if (name == "lazy") {
      out.lazy = take(meta, at, "true");
      ok = out.lazy || take(meta, at, "false");
    } else if (name == "step" || name == "seq") {
      int64_t& v = name == "step" ? out.step : out.seq;
      ok = take_int(meta, at, v) && v >= 1 && v <= max_step;
    } else if (name == "table") {
      ok = take_name(meta, at, out.table);
    } else if (name == "session") {
      ok = take_name(meta, at, out.session) && out.session.size() >= 16 && out.session.size() <= 64;
    } else if (name == "deltas") {
      out.coded = true;
      ok = take(meta, at, "{\"0\":") && take_int64(meta, at, out.first) && take(meta, at, "}");
    } else if (name == "nonce") {
      ok = take_name(meta, at, sent) && sent == nonce;
    } else {
      ok = false;
    }
    if (!ok) return false;
  }
  return take(meta, at, ",\"arrays\":[");
}

py::dtype wire_dtype(char kind, int bytes) {
  if (kind == 'f') return py::dtype("<f4");
  static const char* ints[] = {"", "u1", "<i2", "", "<i4", "", "", "", "<i8"};
  return py::dtype(ints[bytes]);
}

}  // namespace

// A shard's hot request `frames` (het/ps/server/hot.py), in the text het's client writes: a PULL of keys
// {"lazy":L,"table":T,"session":S,"seq":Q,"nonce":N,"arrays":[keys]}, or a PUSH of keys, float32
// gradients and counts {"step":P,"table":T,"session":S,"seq":Q,"nonce":N,"arrays":[...]} (the fields
// in wire.h's order), either with "deltas":{"0":F} before its nonce where its keys travel as steps
// from F; its nonce `nonce`, the session 16 to 64 characters, seq and step in [1, max_step], the
// frames holding exactly the arrays' bytes and at most `max_bytes` with the header. Returns (op,
// request id, table, session, seq, lazy or step, [arrays as numpy views of their frames], F or
// None); None for anything else (the Python reader's, which reads any spelling and names what is wrong).
py::object hot_request(py::list frames, const std::string& nonce, int64_t max_step, int64_t max_bytes) {
  const size_t count = frames.size();
  py::buffer_info head_info;
  Header header;
  if ((count != 2 && count != 4) || !read_header(frames[0], head_info, header)) return py::none();
  const int op = header.op;
  const uint64_t rid = header.id;
  if (!((op == wire::kPull && count == 2) || (op == wire::kPush && count == 4))) return py::none();
  const std::string_view meta = header.meta;
  size_t at = 0;
  HotMeta m;
  const bool read = op == wire::kPull ? read_hot_meta(meta, at, wire::kPullFields, nonce, max_step, m)
                                      : read_hot_meta(meta, at, wire::kPushFields, nonce, max_step, m);
  if (!read) return py::none();
  int64_t keys[1], grads[2], counts[1];
  const int key_bytes = m.coded ? take_any_spec(meta, at, wire::kSteps, 1, keys)
                                : take_any_spec(meta, at, wire::kKeys, 1, keys);
  if (key_bytes == 0) return py::none();
  int count_bytes = 0;
  if (op == wire::kPush) {
    if (!take(meta, at, ",") || take_any_spec(meta, at, wire::kFloats, 2, grads) == 0 || !take(meta, at, ",")) {
      return py::none();
    }
    count_bytes = take_any_spec(meta, at, wire::kInts, 1, counts);
    if (count_bytes == 0) return py::none();
  }
  if (!take(meta, at, "]}") || at != meta.size()) return py::none();
  // the arrays: each frame exactly its spec's bytes, all of them within the limit
  struct Spec {
    char kind;
    int bytes;
    std::vector<int64_t> shape;
  };
  std::vector<Spec> specs = {{'i', key_bytes, {keys[0]}}};
  if (op == wire::kPush) {
    specs.push_back({'f', 4, {grads[0], grads[1]}});
    specs.push_back({'i', count_bytes, {counts[0]}});
  }
  int64_t total = int64_t(kHeader + meta.size());
  py::list arrays;
  for (size_t i = 0; i < specs.size(); ++i) {
    py::buffer_info info;
    std::string_view frame = bytes_of(frames[i + 1], info);
    constexpr int64_t kMost = int64_t(1) << 40;  // values in one array: far past any frame
    int64_t values = 1;
    for (int64_t size : specs[i].shape) {
      if (size > kMost || (size > 0 && values > kMost / size)) return py::none();  // no product overflows
      values *= size;
    }
    if (int64_t(frame.size()) != values * specs[i].bytes) return py::none();
    total += int64_t(frame.size());
    arrays.append(py::array(wire_dtype(specs[i].kind, specs[i].bytes), specs[i].shape, frame.data(),
                            frames[i + 1]));
  }
  if (total > max_bytes) return py::none();
  return py::make_tuple(op, rid, py::str(m.table.data(), m.table.size()),
                        py::str(m.session.data(), m.session.size()), m.seq,
                        op == wire::kPull ? py::object(py::bool_(m.lazy)) : py::object(py::int_(m.step)), arrays,
                        m.coded ? py::object(py::int_(m.first)) : py::object(py::none()));
}
