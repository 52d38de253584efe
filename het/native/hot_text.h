// How the short paths read a message (hot.cpp: a client's replies; hot_request.cpp: a shard's
// requests): a frame's bytes, its header checked, and JSON read exactly as json.dumps writes it.
// Anything else is the Python reader's, which reads any spelling and names what is wrong.
#pragma once

#include <pybind11/numpy.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

#include "wire.h"

namespace hot_text {

namespace py = pybind11;
using wire::kHeader;

// A buffer's bytes, for as long as the object that holds them lives.
inline std::string_view bytes_of(const py::handle& frame, py::buffer_info& info) {
  info = py::reinterpret_borrow<py::buffer>(frame).request();
  return {static_cast<const char*>(info.ptr), size_t(info.size * info.itemsize)};
}

// The text `s` at `at` consumed if it is there.
inline bool take(std::string_view text, size_t& at, std::string_view s) {
  if (text.compare(at, s.size(), s) != 0) return false;
  at += s.size();
  return true;
}

// A meta field's name, `{"name":` for the first field, `,"name":` after, consumed if it is there.
inline bool take_key(std::string_view text, size_t& at, std::string_view name, bool first) {
  const size_t start = at;
  if (take(text, at, first ? "{\"" : ",\"") && take(text, at, name) && take(text, at, "\":")) return true;
  at = start;
  return false;
}

// The digits of a JSON integer as json.dumps writes them (no leading zero), at most 19 of them.
inline bool take_digits(std::string_view text, size_t& at, uint64_t& value) {
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
inline bool take_int(std::string_view text, size_t& at, int64_t& out) {
  uint64_t value;
  if (!take_digits(text, at, value) || value > uint64_t(std::numeric_limits<int64_t>::max())) return false;
  out = int64_t(value);
  return true;
}

// A JSON integer of int64's range, negative ones too (not "-0", which json.dumps never writes).
inline bool take_int64(std::string_view text, size_t& at, int64_t& out) {
  const bool negative = take(text, at, "-");
  uint64_t value;
  const uint64_t limit = uint64_t(std::numeric_limits<int64_t>::max()) + (negative ? 1 : 0);
  if (!take_digits(text, at, value) || value > limit || (negative && value == 0)) return false;
  out = negative ? int64_t(0 - value) : int64_t(value);
  return true;
}


// A JSON string of plain characters (letters, digits, "_-.:"), at most 255 of them, as its text;
// false for any other (an escape, a space: the Python reader's).
inline bool take_name(std::string_view text, size_t& at, std::string_view& out) {
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


// A message's header frame, checked: magic, this version, status and flags 0, its meta all the rest.
struct Header {
  int op;
  uint64_t id;
  std::string_view meta;
};

inline bool read_header(const py::handle& frame, py::buffer_info& info, Header& out) {
  std::string_view head = bytes_of(frame, info);
  if (head.size() < kHeader || head.compare(0, wire::kMagic.size(), wire::kMagic) != 0) return false;
  uint32_t meta_len;
  std::memcpy(&out.id, head.data() + 8, 8);
  std::memcpy(&meta_len, head.data() + 16, 4);
  out.op = uint8_t(head[5]);
  out.meta = head.substr(kHeader);
  return head[4] == wire::kVersion && head[6] == 0 && head[7] == 0 && head.size() == kHeader + meta_len;
}


}  // namespace hot_text
