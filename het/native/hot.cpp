// A client's hot requests and replies (het/ps/client/hot.py's HotPath), and a shard's hot requests
// (het/ps/server/hot.py), each read or written in one call.
//
// A request's header frame written as the Python writer writes it (hot_head), its integers first
// narrowed in one pass (narrow_ints: keys, counts). A reply read (hot_reply): the header checked,
// the meta compared with the text a shard writes for a PULL's or a PUSH's reply, the arrays'
// frames measured against it, and the result made: a PULL's rows (a view of their frame, which it
// keeps alive) and its clocks widened to int64; a PUSH's rows applied. It reads only the exact
// text the shard writes (het/ps/server/hot.py's encode_reply); anything else (an error, a lazy reply with
// rows to build, another spelling of the same meta) it leaves to the Python reader, which reads
// any reply. A shard's hot request read (hot_request) the same way: the text the client's short
// path writes, or nothing (the shard's Python reader then, which reads any spelling).
#include <pybind11/numpy.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

#include "common.h"
#include "wire.h"

namespace py = pybind11;

namespace {

using wire::kHeader;

// A buffer's bytes, for as long as the object that holds them lives.
std::string_view bytes_of(const py::handle& frame, py::buffer_info& info) {
  info = py::reinterpret_borrow<py::buffer>(frame).request();
  return {static_cast<const char*>(info.ptr), size_t(info.size * info.itemsize)};
}

// The text `s` at `at` consumed if it is there.
bool take(std::string_view text, size_t& at, std::string_view s) {
  if (text.compare(at, s.size(), s) != 0) return false;
  at += s.size();
  return true;
}

// A meta field's name, `{"name":` for the first field, `,"name":` after, consumed if it is there.
bool take_key(std::string_view text, size_t& at, std::string_view name, bool first) {
  const size_t start = at;
  if (take(text, at, first ? "{\"" : ",\"") && take(text, at, name) && take(text, at, "\":")) return true;
  at = start;
  return false;
}

// The digits of a JSON integer as json.dumps writes them (no leading zero), at most 19 of them.
bool take_digits(std::string_view text, size_t& at, uint64_t& value) {
  const size_t start = at;
  value = 0;  // 19 digits fit
  while (at < text.size() && at - start < 19 && text[at] >= '0' && text[at] <= '9') {
    value = value * 10 + uint64_t(text[at++] - '0');
  }
  const size_t digits = at - start;
  const bool more = at < text.size() && text[at] >= '0' && text[at] <= '9';  // a 20th digit: past int64
  return digits >= 1 && !more && !(digits > 1 && text[start] == '0');
}

// A JSON integer >= 0, up to int64's greatest.
bool take_int(std::string_view text, size_t& at, int64_t& out) {
  uint64_t value;
  if (!take_digits(text, at, value) || value > uint64_t(std::numeric_limits<int64_t>::max())) return false;
  out = int64_t(value);
  return true;
}

// A JSON integer of int64's range, negative ones too (not "-0", which json.dumps never writes).
bool take_int64(std::string_view text, size_t& at, int64_t& out) {
  const bool negative = take(text, at, "-");
  uint64_t value;
  const uint64_t limit = uint64_t(std::numeric_limits<int64_t>::max()) + (negative ? 1 : 0);
  if (!take_digits(text, at, value) || value > limit || (negative && value == 0)) return false;
  out = negative ? int64_t(0 - value) : int64_t(value);
  return true;
}

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

// A message's header frame, checked: magic, this version, status and flags 0, its meta all the rest.
struct Header {
  int op;
  uint64_t id;
  std::string_view meta;
};

bool read_header(const py::handle& frame, py::buffer_info& info, Header& out) {
  std::string_view head = bytes_of(frame, info);
  if (head.size() < kHeader || head.compare(0, wire::kMagic.size(), wire::kMagic) != 0) return false;
  uint32_t meta_len;
  std::memcpy(&out.id, head.data() + 8, 8);
  std::memcpy(&meta_len, head.data() + 16, 4);
  out.op = uint8_t(head[5]);
  out.meta = head.substr(kHeader);
  return head[4] == wire::kVersion && head[6] == 0 && head[7] == 0 && head.size() == kHeader + meta_len;
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

namespace {

// A JSON string of plain characters (letters, digits, "_-.:"), at most 255 of them, as its text;
// false for any other (an escape, a space: the Python reader's).
bool take_name(std::string_view text, size_t& at, std::string_view& out) {
  if (!take(text, at, "\"")) return false;
  const size_t start = at;
  while (at < text.size() && at - start <= 255) {
    const char c = text[at];
    if (c == '"') break;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.' || c == ':'))
      return false;
    ++at;
  }
  out = text.substr(start, at - start);
  return at - start <= 255 && take(text, at, "\"");
}

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
