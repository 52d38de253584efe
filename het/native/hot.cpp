// A client's hot requests and replies (het/ps/client/hot.py's HotPath), each read or written in one
// call; a shard's hot requests are read in hot_request.cpp.
//
// A request's header frame written as the Python writer writes it (hot_head), its integers first
// narrowed in one pass (narrow_ints: keys, counts). A reply read (hot_reply): the header checked,
// the meta compared with the text a shard writes for a PULL's or a PUSH's reply, the arrays'
// frames measured against it, and the result made: a PULL's rows (a view of their frame, which it
// keeps alive) and its clocks widened to int64; a PUSH's rows applied. It reads only the exact
// text the shard writes (het/ps/server/hot.py's encode_reply); anything else (an error, a lazy reply with
// rows to build, another spelling of the same meta) it leaves to the Python reader, which reads
// any reply.
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

#include "common.h"
#include "hot_text.h"
#include "wire.h"

namespace py = pybind11;
using namespace hot_text;  // NOLINT: the readers of hot_text.h, by name

namespace {

// One array's spec, ["code",[sizes...]], of exactly `shape`.
bool take_spec(std::string_view text, size_t& at, std::string_view code, std::initializer_list<int64_t> shape) {
  if (!take(text, at, "[\"") || !take(text, at, code) || !take(text, at, "\",[")) return false;
  bool first = true;
  for (int64_t size : shape) {
    int64_t got;
    if ((!first && !take(text, at, ",")) || !take_int(text, at, got) || got != size) return false;
    first = false;
  }
  return take(text, at, "]]");
}

// The clocks' code: how many bytes each, 0 for none of the wire's integers.
int clock_bytes(std::string_view text, size_t at) {
  for (const auto& [code, bytes] : wire::kInts)
    if (text.compare(at + 2, code.size(), code) == 0) return bytes;
  return 0;
}

torch::Tensor widened(const char* p, int64_t n, int bytes) {
  auto out = torch::empty({n}, torch::kInt64);
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i, p += bytes) {  // little-endian, read byte-wise: a frame need not be aligned
    if (bytes == 1) {
      o[i] = uint8_t(*p);
    } else if (bytes == 2) {
      int16_t v;
      std::memcpy(&v, p, 2);
      o[i] = v;
    } else if (bytes == 4) {
      int32_t v;
      std::memcpy(&v, p, 4);
      o[i] = v;
    } else {
      std::memcpy(&o[i], p, 8);
    }
  }
  return out;
}

}  // namespace

// The reply `frames` to request `rid` (`op`: 1 PULL, 2 PUSH) of `n` keys of a float32 table of
// width `dim`, as the shard writes it: a PULL's (rows (n, dim), clocks (n,) int64, bytes of its
// arrays), its rows a view of their frame; a PUSH's (rows applied, 0); else None.
py::object hot_reply(py::list frames, int64_t op, uint64_t rid, int64_t n, int64_t dim) {
  const size_t count = frames.size();
  if (count == 0 || n < 0 || dim < 1) return py::none();
  py::buffer_info head_info;
  Header header;
  if (!read_header(frames[0], head_info, header) || header.op != op || header.id != rid) return py::none();
  const std::string_view meta = header.meta;
  size_t at = 0;
  if (op == wire::kPush) {  // {"applied":N,"arrays":[]}
    int64_t applied;
    if (count != 1 || !take_key(meta, at, wire::kApplied, true) || !take_int(meta, at, applied) ||
        !take(meta, at, ",\"arrays\":[]}") || at != meta.size())
      return py::none();
    return py::make_tuple(applied, 0);
  }
  if (op != wire::kPull || (count != 3 && count != 4)) return py::none();
  // {"arrays":[["f4",[n,dim]],["<clocks>",[n]](,["u1",[marks]])]}
  if (!take(meta, at, "{\"arrays\":[") || !take_spec(meta, at, "f4", {n, dim}) || !take(meta, at, ","))
    return py::none();
  const int clock_size = meta.size() >= at + 4 ? clock_bytes(meta, at) : 0;
  if (clock_size == 0 || !take_spec(meta, at, meta.substr(at + 2, 2), {n})) return py::none();
  const int64_t marks = (n + 7) / 8;
  if (count == 4 && (!take(meta, at, ",") || !take_spec(meta, at, "u1", {marks}))) return py::none();
  if (!take(meta, at, "]}") || at != meta.size()) return py::none();
  py::buffer_info rows_info, clocks_info, marks_info;
  std::string_view rows = bytes_of(frames[1], rows_info), clocks = bytes_of(frames[2], clocks_info);
  if (rows.size() != size_t(n * dim * 4) || clocks.size() != size_t(n * clock_size) ||
      reinterpret_cast<uintptr_t>(rows.data()) % alignof(float) != 0)
    return py::none();
  size_t total = rows.size() + clocks.size();
  if (count == 4) {
    std::string_view built = bytes_of(frames[3], marks_info);
    if (built.size() != size_t(marks)) return py::none();
    for (char c : built)
      if (c != 0) return py::none();  // rows to build: the Python reader's
    total += built.size();
  }
  auto* keep = new py::object(py::reinterpret_borrow<py::object>(frames[1]));
  auto rows_tensor = torch::from_blob(const_cast<char*>(rows.data()), {n, dim},
                                      [keep](void*) {
                                        py::gil_scoped_acquire gil;
                                        delete keep;
                                      },
                                      torch::kFloat32);
  return py::make_tuple(rows_tensor, widened(clocks.data(), n, clock_size), total);
}

// `values` (int64, 1-D, contiguous) as the narrowest of uint8, int16, int32 (from the one at
// `narrowest`: 0 uint8, 1 int16, 2 int32) that holds every one, else themselves (int64); and the
// least and greatest of them (0 and 0 for none). het/ps/protocol/integers.py's narrow, in one pass.
py::tuple narrow_ints(torch::Tensor values, int64_t narrowest) {
  TORCH_CHECK(values.device().is_cpu() && values.scalar_type() == torch::kInt64 && values.dim() == 1 &&
                  values.is_contiguous(),
              "values: expected a contiguous 1-D int64 CPU tensor");
  const int64_t n = values.numel();
  const int64_t* v = values.data_ptr<int64_t>();
  int64_t lo = n ? v[0] : 0, hi = lo;
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, v[i]);
    hi = std::max(hi, v[i]);
  }
  torch::Tensor out = values;
  if (narrowest <= 0 && lo >= 0 && hi <= 255) {
    out = torch::empty({n}, torch::kUInt8);
    uint8_t* o = out.data_ptr<uint8_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = uint8_t(v[i]);
  } else if (narrowest <= 1 && lo >= -32768 && hi <= 32767) {
    out = torch::empty({n}, torch::kInt16);
    int16_t* o = out.data_ptr<int16_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = int16_t(v[i]);
  } else if (lo >= std::numeric_limits<int32_t>::min() && hi <= std::numeric_limits<int32_t>::max()) {
    out = torch::empty({n}, torch::kInt32);
    int32_t* o = out.data_ptr<int32_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = int32_t(v[i]);
  }
  return py::make_tuple(out, lo, hi);
}

// A hot request's header frame: the header, then the meta `head` + its arrays' specs + "]}", the
// specs written as het/ps/protocol/messages.py's specs_text writes them; and the bytes of the arrays.
// None where an array is not C-contiguous or not of a wire dtype (the Python writer's then).
py::object hot_head(int64_t op, uint64_t rid, const std::string& head, py::list arrays) {
  std::string text = head;
  int64_t nbytes = 0;
  bool first = true;
  for (const auto& a : arrays) {
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(a).request();
    const char kind = info.format.empty() ? 0 : info.format.back();
    const char* code = nullptr;
    if (kind == 'f' && info.itemsize == 4) code = "f4";
    else if (kind == 'B' && info.itemsize == 1) code = "u1";
    else if ((kind == 'h') && info.itemsize == 2) code = "i2";
    else if ((kind == 'i' || kind == 'l') && info.itemsize == 4) code = "i4";
    else if ((kind == 'l' || kind == 'q') && info.itemsize == 8) code = "i8";
    const bool native_order = info.format.size() == 1 || info.format[0] == '<' || info.format[0] == '=';
    if (code == nullptr || info.format.size() > 2 || !native_order) return py::none();
    int64_t stride = info.itemsize;
    for (int64_t d = info.ndim - 1; d >= 0; --d) {  // C-contiguous: each stride the product of the sizes after it
      if (info.shape[size_t(d)] > 1 && info.strides[size_t(d)] != stride) return py::none();
      stride *= info.shape[size_t(d)];
    }
    text += first ? "[\"" : ",[\"";
    text += code;
    text += "\",[";
    for (int64_t d = 0; d < info.ndim; ++d) {
      if (d) text += ',';
      text += std::to_string(info.shape[size_t(d)]);
    }
    text += "]]";
    nbytes += info.size * info.itemsize;
    first = false;
  }
  text += "]}";
  std::string frame(kHeader, '\0');
  std::memcpy(frame.data(), wire::kMagic.data(), wire::kMagic.size());
  frame[4] = char(wire::kVersion);
  frame[5] = char(op);
  const uint64_t id = uint64_t(rid);
  const uint32_t meta_len = uint32_t(text.size());
  std::memcpy(frame.data() + 8, &id, 8);
  std::memcpy(frame.data() + 16, &meta_len, 4);
  frame += text;
  return py::make_tuple(py::bytes(frame), nbytes);
}
