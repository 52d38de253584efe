// The operators het's native core exports to Python (module.cpp binds them), by component.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

// The worker cache (cache_lookup.cpp, cache_update.cpp)
torch::Tensor cache_sets(torch::Tensor keys, int64_t num_sets);
std::vector<torch::Tensor> cache_lookup(torch::Tensor keys, torch::Tensor nxt, torch::Tensor tkeys,
                                        torch::Tensor held, torch::Tensor rows, torch::Tensor pending,
                                        torch::Tensor clock, torch::Tensor updates, torch::Tensor last_use,
                                        torch::Tensor uses, torch::Tensor score, int64_t ways, int64_t step,
                                        int64_t protect, bool lfu, torch::Tensor soon, int64_t now, bool ahead,
                                        torch::Tensor sq);
void cache_soon(torch::Tensor keys, torch::Tensor tkeys, torch::Tensor held, torch::Tensor soon, int64_t ways,
                int64_t number);
std::vector<torch::Tensor> cache_fill(torch::Tensor slot, torch::Tensor hit, torch::Tensor index,
                                      torch::Tensor sent, torch::Tensor sent_clocks, torch::Tensor rows,
                                      torch::Tensor pending, torch::Tensor clock, double local_lr,
                                      torch::Tensor acc, torch::Tensor sent_state, torch::Tensor sq,
                                      torch::Tensor updates, double lr, double eps);
std::vector<torch::Tensor> cache_update(torch::Tensor keys, torch::Tensor slot, torch::Tensor grads,
                                        torch::Tensor tkeys, torch::Tensor held, torch::Tensor rows,
                                        torch::Tensor pending, torch::Tensor clock, torch::Tensor updates,
                                        double local_lr, double bound, bool own_seen, bool clear_clock,
                                        torch::Tensor acc, torch::Tensor sq, double lr, double eps);
std::vector<torch::Tensor> unique_inverse(torch::Tensor keys);  // unique.cpp
std::vector<torch::Tensor> adam_steps(torch::Tensor old_m, torch::Tensor old_v, torch::Tensor grads,  // adam.cpp
                                      torch::Tensor counts, torch::Tensor sq, torch::Tensor p1, torch::Tensor p2,
                                      torch::Tensor sizes, double eps);

// A table's push on the shard (table.cpp)
int64_t table_push(const std::string& kind, torch::Tensor weight, std::vector<torch::Tensor> state,
                   torch::Tensor clocks, torch::Tensor touched, torch::Tensor rows, torch::Tensor at,
                   torch::Tensor inverse, torch::Tensor grads, torch::Tensor counts, double lr, double eps,
                   double beta1, double beta2, double step_size, int64_t max_clock, torch::Tensor steps,
                   torch::Tensor sq);
int64_t table_push_half(const std::string& kind, torch::Tensor weight, std::vector<torch::Tensor> state,
                        torch::Tensor clocks, torch::Tensor touched, bool stochastic, int64_t shards, int64_t index,
                        torch::Tensor rows, torch::Tensor at, torch::Tensor inverse, torch::Tensor grads,
                        torch::Tensor counts, double lr, double eps, double beta1, double beta2, double step_size,
                        int64_t max_clock, torch::Tensor steps, torch::Tensor sq);
int64_t chunk_push(const std::string& kind, std::vector<torch::Tensor> weight, std::vector<torch::Tensor> state,
                   std::vector<torch::Tensor> meta, int64_t bits, bool fixed, int64_t S, int64_t step,
                   bool stochastic, torch::Tensor keys, torch::Tensor rows, torch::Tensor at, torch::Tensor inverse,
                   torch::Tensor grads, torch::Tensor counts, double lr, double eps, double beta1, double beta2,
                   double step_size, int64_t max_clock, torch::Tensor steps, torch::Tensor sq);
bool all_finite_op(torch::Tensor x);

// A reply's rows on the shard (replies.cpp)
void gather_rows(torch::Tensor weight, torch::Tensor idx, torch::Tensor out);
std::vector<torch::Tensor> gather_touched(torch::Tensor weight, torch::Tensor touched, torch::Tensor idx,
                                          torch::Tensor out);
std::vector<torch::Tensor> pull_touched(torch::Tensor weight, torch::Tensor touched, torch::Tensor clocks,
                                        torch::Tensor idx, torch::Tensor out);

// A request's keys routed to shards and its replies' rows put back in order, on the client (routes.cpp)
std::vector<torch::Tensor> shard_order(torch::Tensor values, int64_t shards);
void scatter_rows(torch::Tensor src, torch::Tensor idx, torch::Tensor out);

// A disk tier's reads (records.cpp)
void read_records(torch::Tensor fds, torch::Tensor offsets, int64_t record_bytes, torch::Tensor out,
                  int64_t threads);

// Rows stored in half precision (halves.cpp)
int64_t round_rows(torch::Tensor values, torch::Tensor out, torch::Tensor salts, bool stochastic);
double refused_value();

// A dynamic table's chunks (chunks.cpp)
void chunk_gather(std::vector<torch::Tensor> parts, int64_t bits, bool fixed, torch::Tensor slots,
                  torch::Tensor out, bool missing);
void chunk_scatter(std::vector<torch::Tensor> parts, int64_t bits, bool fixed, torch::Tensor slots,
                   torch::Tensor rows);

// Initial rows and a lazy reply (rows.cpp)
torch::Tensor initial_rows(torch::Tensor counters, int64_t dim, int64_t salt, double scale);
std::vector<torch::Tensor> lazy_reply(torch::Tensor sent, torch::Tensor bits, torch::Tensor keys,
                                      torch::Tensor clocks, torch::Tensor state, torch::Tensor init, int64_t salt,
                                      double scale);

// An export's key index (index.cpp)
torch::Tensor index_lookup(torch::Tensor hashes, torch::Tensor directory, int64_t bits, torch::Tensor keys);
