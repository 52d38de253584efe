// What the native short paths know of a PS message (het/native/hot.cpp): written by
// het/ps/protocol/schema.py, its one declaration (`python -m het.ps.protocol.schema`). Do not edit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace wire {

constexpr size_t kHeader = 20;  // <4sBBBBQI: magic, version, op, status, flags, id, meta length
constexpr std::string_view kMagic = "HETP";
constexpr int kVersion = 1;
constexpr int kPull = 1;
constexpr int kPush = 2;

struct Code {
  std::string_view code;
  int bytes;
};

constexpr Code kInts[] = {{"u1", 1}, {"i2", 2}, {"i4", 4}, {"i8", 8}};
constexpr Code kKeys[] = {{"i4", 4}, {"i8", 8}};
constexpr Code kSteps[] = {{"u1", 1}, {"i2", 2}, {"i4", 4}};
constexpr Code kFloats[] = {{"f4", 4}};

constexpr std::string_view kPullFields[] = {"lazy", "table", "session", "seq", "deltas", "nonce"};  // PULL's, in order
constexpr std::string_view kPushFields[] = {"step", "table", "session", "seq", "deltas", "nonce"};  // PUSH's, in order
constexpr std::string_view kApplied = "applied";  // a PUSH reply's field

}  // namespace wire
