// The in-process communicator: every collective on groups of 1, 2, 3, 4 and 8 ranks, with
// results checked against a direct computation; rank-order summation (bitwise identical on
// every rank); uneven and zero all_to_all_v counts; FIFO send/recv with a bounded mailbox;
// statistics; mismatched calls and abort.
#include "comm/in_process.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "core/error.h"

namespace moeserve::comm {
namespace {

// Runs fn(rank, communicator) on one thread per rank of a world of `n`, all in one group.
void run_ranks(int n, const std::function<void(int, Communicator&)>& fn, InProcessOptions options = {}) {
  InProcessWorld world(n, options);
  std::vector<int> members(n);
  for (int r = 0; r < n; ++r) members[r] = r;
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(world.communicator(r, "test", members));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r, *comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        world.abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// A value that differs per rank and element, with fractions that make float sums order-sensitive.
float value(int rank, size_t i) {
  return static_cast<float>(rank + 1) * 0.1f + static_cast<float>(i) * 1e-3f + 1e7f * (i % 3 == 0);
}

class CommSizes : public ::testing::TestWithParam<int> {};

TEST_P(CommSizes, AllReduceSumsInRankOrderAndAgreesBitwise) {
  const int n = GetParam();
  const size_t count = 37;
  std::vector<std::vector<float>> results(n);
  run_ranks(n, [&](int rank, Communicator& c) {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = value(rank, i);
    for (int repeat = 0; repeat < 3; ++repeat) {  // reuse the group: generations advance
      std::vector<float> copy = data;
      c.all_reduce_sum(copy.data(), count, DType::F32);
      results[rank] = copy;
    }
  });
  for (size_t i = 0; i < count; ++i) {
    float expected = value(0, i);
    for (int r = 1; r < n; ++r) expected += value(r, i);
    for (int r = 0; r < n; ++r) EXPECT_EQ(results[r][i], expected) << "rank " << r << " element " << i;
  }
}

TEST_P(CommSizes, AllReduceIntegerAndBf16) {
  const int n = GetParam();
  run_ranks(n, [&](int rank, Communicator& c) {
    std::vector<int64_t> ints = {rank, 10 * rank, -1};
    c.all_reduce_sum(ints.data(), ints.size(), DType::I64);
    EXPECT_EQ(ints[0], n * (n - 1) / 2);
    EXPECT_EQ(ints[1], 10 * n * (n - 1) / 2);
    EXPECT_EQ(ints[2], -n);
    std::vector<uint16_t> halves = {f32_to_bf16(0.5f), f32_to_bf16(static_cast<float>(rank))};
    c.all_reduce_sum(halves.data(), halves.size(), DType::BF16);
    EXPECT_EQ(bf16_to_f32(halves[0]), 0.5f * n);
    EXPECT_EQ(bf16_to_f32(halves[1]), static_cast<float>(n * (n - 1) / 2));
  });
}

TEST_P(CommSizes, AllGatherConcatenatesInRankOrder) {
  const int n = GetParam();
  run_ranks(n, [&](int rank, Communicator& c) {
    const size_t count = 5;
    std::vector<float> send(count), recv(count * n, -1.0f);
    for (size_t i = 0; i < count; ++i) send[i] = value(rank, i);
    c.all_gather(send.data(), recv.data(), count, DType::F32);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) EXPECT_EQ(recv[r * count + i], value(r, i));
  });
}

TEST_P(CommSizes, AllGatherInPlace) {
  const int n = GetParam();
  run_ranks(n, [&](int rank, Communicator& c) {
    std::vector<int32_t> buffer(2 * n, -1);
    buffer[2 * rank] = rank;
    buffer[2 * rank + 1] = 100 + rank;
    c.all_gather(buffer.data() + 2 * rank, buffer.data(), 2, DType::I32);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(buffer[2 * r], r);
      EXPECT_EQ(buffer[2 * r + 1], 100 + r);
    }
  });
}

TEST_P(CommSizes, ReduceScatterGivesEachRankItsBlockOfTheSum) {
  const int n = GetParam();
  const size_t count = 3;
  run_ranks(n, [&](int rank, Communicator& c) {
    std::vector<float> send(count * n), recv(count);
    for (size_t i = 0; i < send.size(); ++i) send[i] = value(rank, i);
    c.reduce_scatter_sum(send.data(), recv.data(), count, DType::F32);
    for (size_t i = 0; i < count; ++i) {
      const size_t at = rank * count + i;
      float expected = value(0, at);
      for (int r = 1; r < n; ++r) expected += value(r, at);
      EXPECT_EQ(recv[i], expected);
    }
  });
}

// Rank s sends (s + d) % 3 elements to rank d (uneven, with zeros), valued 1000 s + 10 d + i.
TEST_P(CommSizes, AllToAllVUnevenAndZeroCounts) {
  const int n = GetParam();
  auto count_of = [](int s, int d) { return static_cast<size_t>((s + d) % 3); };
  run_ranks(n, [&](int rank, Communicator& c) {
    std::vector<size_t> send_counts(n), recv_counts(n);
    std::vector<int32_t> send;
    for (int d = 0; d < n; ++d) {
      send_counts[d] = count_of(rank, d);
      recv_counts[d] = count_of(d, rank);
      for (size_t i = 0; i < send_counts[d]; ++i) send.push_back(1000 * rank + 10 * d + static_cast<int32_t>(i));
    }
    size_t total = 0;
    for (size_t k : recv_counts) total += k;
    std::vector<int32_t> recv(total, -1);
    c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::I32);
    size_t at = 0;
    for (int s = 0; s < n; ++s)
      for (size_t i = 0; i < recv_counts[s]; ++i) EXPECT_EQ(recv[at++], 1000 * s + 10 * rank + static_cast<int32_t>(i));
  });
}

TEST_P(CommSizes, AllToAllVAllZero) {
  const int n = GetParam();
  run_ranks(n, [&](int rank, Communicator& c) {
    std::vector<size_t> zeros(n, 0);
    c.all_to_all_v(nullptr, zeros, nullptr, zeros, DType::F32);
    EXPECT_EQ(c.stats().by_collective[Collective::AllToAllV].calls, 1);
    EXPECT_EQ(c.stats().by_collective[Collective::AllToAllV].bytes, 0);
  });
}

TEST_P(CommSizes, BroadcastFromEveryRoot) {
  const int n = GetParam();
  run_ranks(n, [&](int rank, Communicator& c) {
    for (int root = 0; root < n; ++root) {
      std::vector<double> data = {rank == root ? 3.5 + root : -1.0, rank == root ? 1.0 * root : -2.0};
      c.broadcast(data.data(), data.size(), DType::F64, root);
      EXPECT_EQ(data[0], 3.5 + root);
      EXPECT_EQ(data[1], 1.0 * root);
    }
  });
}

TEST_P(CommSizes, BarrierOrdersPhases) {
  const int n = GetParam();
  std::atomic<int> arrived{0};
  run_ranks(n, [&](int, Communicator& c) {
    arrived++;
    c.barrier();
    EXPECT_EQ(arrived.load(), n);  // nobody leaves before everyone arrived
    c.barrier();
  });
}

TEST_P(CommSizes, SendRecvRingIsFifo) {
  const int n = GetParam();
  if (n == 1) {  // a group of one has no peer: sending to oneself is an error
    run_ranks(1, [](int, Communicator& c) {
      int32_t v = 0;
      EXPECT_THROW(c.send(&v, 1, DType::I32, 0), Error);
    });
    return;
  }
  run_ranks(
      n,
      [&](int rank, Communicator& c) {
        const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        for (int m = 0; m < 5; ++m) {
          const std::vector<int32_t> out = {rank, m};
          c.send(out.data(), out.size(), DType::I32, next);
        }
        for (int m = 0; m < 5; ++m) {
          std::vector<int32_t> in(2);
          c.recv(in.data(), in.size(), DType::I32, prev);
          EXPECT_EQ(in[0], prev);
          EXPECT_EQ(in[1], m);
        }
      },
      InProcessOptions{/*send_capacity=*/0});
}

TEST_P(CommSizes, StatsCountCallsAndBytesPerSite) {
  const int n = GetParam();
  run_ranks(n, [&](int rank, Communicator& c) {
    std::vector<float> a(10), g(10 * n), rs(4 * n), out(4);
    c.set_site("attention");
    c.all_reduce_sum(a.data(), 10, DType::F32);
    c.all_reduce_sum(a.data(), 10, DType::F32);
    c.set_site("lm_head");
    c.all_gather(a.data(), g.data(), 10, DType::F32);
    c.reduce_scatter_sum(rs.data(), out.data(), 4, DType::F32);
    EXPECT_EQ(c.stats().at("attention", Collective::AllReduce), (CommStats::Entry{2, 80}));
    EXPECT_EQ(c.stats().at("lm_head", Collective::AllGather), (CommStats::Entry{1, 40}));
    EXPECT_EQ(c.stats().at("lm_head", Collective::ReduceScatter), (CommStats::Entry{1, 16 * n}));
    EXPECT_EQ(c.stats().at("attention", Collective::AllGather), (CommStats::Entry{0, 0}));
    EXPECT_EQ(c.stats().by_collective.at(Collective::AllReduce).calls, 2);
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, CommSizes, ::testing::Values(1, 2, 3, 4, 8));

TEST(InProcess, BoundedMailboxMakesTheSenderWait) {
  // Capacity 2: the sender can be at most two messages ahead of the receiver.
  std::atomic<int> sent{0}, received{0};
  std::atomic<int> max_ahead{0};
  run_ranks(
      2,
      [&](int rank, Communicator& c) {
        for (int m = 0; m < 20; ++m) {
          int32_t v = m;
          if (rank == 0) {
            c.send(&v, 1, DType::I32, 1);
            ++sent;
            max_ahead = std::max(max_ahead.load(), sent.load() - received.load());
          } else {
            std::this_thread::yield();
            c.recv(&v, 1, DType::I32, 0);
            EXPECT_EQ(v, m);
            ++received;
          }
        }
      },
      InProcessOptions{/*send_capacity=*/2});
  EXPECT_LE(max_ahead.load(), 3);  // two queued + one just taken but not yet counted
}

TEST(InProcess, SubgroupsOfOneWorldAreIndependent) {
  // World of 4 split into {0,1} and {2,3}, plus the pipeline-style groups {0,2} and {1,3}.
  InProcessWorld world(4);
  std::vector<std::unique_ptr<Communicator>> row(4), column(4);
  for (int r = 0; r < 4; ++r) {
    row[r] = world.communicator(r, "row", r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
    column[r] = world.communicator(r, "column", r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3});
  }
  EXPECT_EQ(row[3]->rank(), 1);
  EXPECT_EQ(column[2]->rank(), 1);
  std::vector<std::thread> threads;
  std::vector<int32_t> row_sum(4), column_sum(4);
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      int32_t v = r;
      row[r]->all_reduce_sum(&v, 1, DType::I32);
      row_sum[r] = v;
      v = r;
      column[r]->all_reduce_sum(&v, 1, DType::I32);
      column_sum[r] = v;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(row_sum, (std::vector<int32_t>{1, 1, 5, 5}));
  EXPECT_EQ(column_sum, (std::vector<int32_t>{2, 4, 2, 4}));
}

TEST(InProcess, MismatchedCallsFailOnEveryRank) {
  InProcessWorld world(2);
  auto c0 = world.communicator(0, "g", {0, 1});
  auto c1 = world.communicator(1, "g", {0, 1});
  std::string e0, e1;
  std::thread t0([&] {
    try {
      float v = 1;
      c0->all_reduce_sum(&v, 1, DType::F32);
    } catch (const Error& e) {
      e0 = e.what();
    }
  });
  std::thread t1([&] {
    try {
      float v[2] = {1, 2};
      c1->all_reduce_sum(v, 2, DType::F32);
    } catch (const Error& e) {
      e1 = e.what();
    }
  });
  t0.join();
  t1.join();
  EXPECT_EQ(e0, "group 'g' all_reduce: rank 0 has count 1 root 0 while rank 1 has count 2 root 0");
  EXPECT_EQ(e1, e0);
}

TEST(InProcess, AllToAllVCountMismatchNamesBothRanks) {
  for (int repeat = 0; repeat < 20; ++repeat) {  // the failing rank must not free what a peer still reads
    InProcessWorld world(2);
    auto c0 = world.communicator(0, "moe", {0, 1});
    auto c1 = world.communicator(1, "moe", {0, 1});
    std::string e0, e1;
    auto body = [](Communicator& c, std::vector<size_t> send_counts, std::vector<size_t> recv_counts,
                   std::string& err) {
      try {
        std::vector<float> send(8), recv(8);
        c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::F32);
      } catch (const Error& e) {
        err = e.what();
      }
    };
    std::thread t0([&] { body(*c0, {1, 2}, {1, 1}, e0); });
    std::thread t1([&] { body(*c1, {1, 1}, {3, 1}, e1); });
    t0.join();
    t1.join();
    EXPECT_EQ(e0, "group 'moe' all_to_all_v: rank 0 sends 2 elements to rank 1, which expects 3");
    EXPECT_EQ(e1, e0);
  }
}

TEST(InProcess, UnsupportedSumAndBadRootFailOnEveryRank) {
  for (int repeat = 0; repeat < 20; ++repeat) {  // the failing call must not race with its peers
    InProcessWorld world(3);
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < 3; ++r) comms.push_back(world.communicator(r, "g", {0, 1, 2}));
    std::vector<std::string> errors(3), root_errors(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r)
      threads.emplace_back([&, r] {
        std::vector<uint8_t> bytes(4, 1);
        try {
          comms[r]->all_reduce_sum(bytes.data(), bytes.size(), DType::U8);
        } catch (const Error& e) {
          errors[r] = e.what();
        }
        try {
          comms[r]->broadcast(bytes.data(), bytes.size(), DType::U8, 5);
        } catch (const Error& e) {
          root_errors[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(errors[r], "group 'g' all_reduce: cannot sum U8 values");
      EXPECT_EQ(root_errors[r], "group 'g' broadcast: root 5 outside a group of 3");
    }
  }
}

TEST(InProcess, AbortWakesBlockedRanks) {
  InProcessWorld world(2);
  auto c0 = world.communicator(0, "g", {0, 1});
  std::string error;
  std::thread waiter([&] {
    try {
      int32_t v = 0;
      c0->recv(&v, 1, DType::I32, 1);  // never sent
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  world.abort("rank 1 failed: boom");
  waiter.join();
  EXPECT_EQ(error, "communication aborted: rank 1 failed: boom");
  EXPECT_THROW(c0->barrier(), Error);
}

TEST(InProcess, BadGroupsAreRejected) {
  InProcessWorld world(2);
  EXPECT_THROW(world.communicator(0, "g", {0, 0}), Error);
  EXPECT_THROW(world.communicator(0, "g", {0, 2}), Error);
  EXPECT_THROW(world.communicator(1, "g", {0}), Error);
  EXPECT_THROW(InProcessWorld(0), Error);
  auto solo = world.communicator(0, "solo", {0});
  int32_t v = 1;
  EXPECT_THROW(solo->send(&v, 1, DType::I32, 0), Error);
}

}  // namespace
}  // namespace moeserve::comm
