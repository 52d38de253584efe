// A disk tier's reads (het/ps/server/store/disk.py): records at byte offsets of segment files, read
// with pread by several threads at once. A random read of a record not in the page cache waits
// on the disk; threads keep several in flight (`python docs/scripts/tier_reads.py`, docs/RESULTS.md:
// 4-5x the records/s of a read-only map with 16), and a read in the page cache is a copy, without
// the map's page fault and the unmapping after.
#include "common.h"
#include "ops.h"

#include <cerrno>
#include <cstring>
#include <thread>
#include <unistd.h>

// Record i: `record_bytes` at byte offsets[i] of descriptor fds[i], into row i of `out` (n rows
// of record_bytes). `threads` readers at most, each a contiguous share of at least 64 records.
// Raises naming the descriptor and offset of a read that failed or came back short (a file cut).
void read_records(torch::Tensor fds, torch::Tensor offsets, int64_t record_bytes, torch::Tensor out,
                  int64_t threads) {
  check(fds, torch::kInt32, "fds");
  check(offsets, torch::kInt64, "offsets");
  TORCH_CHECK(out.device().is_cpu() && out.is_contiguous(), "out: expected a contiguous CPU tensor");
  const int64_t n = offsets.numel();
  TORCH_CHECK(fds.numel() == n, "fds: expected ", n, ", got ", fds.numel());
  TORCH_CHECK(record_bytes > 0 && out.numel() * out.element_size() == n * record_bytes, "out: expected ", n,
              " records of ", record_bytes, " bytes, got ", out.numel() * out.element_size(), " bytes");
  const int32_t* fd = fds.data_ptr<int32_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  char* dst = static_cast<char*>(out.data_ptr());
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(threads, n / 64));
  std::vector<int64_t> failed(size_t(workers), -1), error(size_t(workers), 0);
  auto read_share = [&](int64_t w) {
    const int64_t lo = n * w / workers, hi = n * (w + 1) / workers;
    for (int64_t i = lo; i < hi; ++i) {
      int64_t done = 0;
      while (done < record_bytes) {
        const ssize_t got = pread(fd[i], dst + i * record_bytes + done, size_t(record_bytes - done), off[i] + done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
          failed[size_t(w)] = i, error[size_t(w)] = got < 0 ? errno : 0;
          return;
        }
        done += got;
      }
    }
  };
  std::vector<std::thread> pool;  // (bound without the GIL: other Python threads go on meanwhile)
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(read_share, w);
  read_share(0);
  for (auto& t : pool) t.join();
  for (int64_t w = 0; w < workers; ++w) {
    const int64_t i = failed[size_t(w)];
    TORCH_CHECK(i < 0, "reading record bytes ", off[i], "..", off[i] + record_bytes - 1, " of descriptor ", fd[i],
                ": ", error[size_t(w)] ? std::strerror(int(error[size_t(w)])) : "the file ends before it");
  }
}
