#include "comm/in_process.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>

#include "comm/rank_order_sum.h"
#include "core/error.h"

namespace moeserve::comm {

namespace {

// What one rank publishes for the current call.
struct Slot {
  Collective op = Collective::Barrier;
  DType dtype = DType::F32;
  size_t count = 0;
  int root = 0;
  const void* send = nullptr;
  const std::vector<size_t>* send_counts = nullptr;
  const std::vector<size_t>* recv_counts = nullptr;
};

struct Message {
  DType dtype;
  size_t count;
  std::vector<std::byte> bytes;
};

}  // namespace

struct Group;

struct InProcessState {
  int size = 0;
  InProcessOptions options;
  std::atomic<bool> aborted{false};
  std::mutex mutex;  // guards groups and abort_reason
  std::string abort_reason;
  std::map<std::string, std::shared_ptr<Group>> groups;

  [[noreturn]] void throw_aborted() {
    std::lock_guard<std::mutex> lock(mutex);
    fail("communication aborted: {}", abort_reason);
  }
};

// The state the ranks of one group share.
struct Group {
  std::string name;
  std::vector<int> members;  // world ranks in group-rank order
  InProcessState* world = nullptr;
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<Slot> slots;                   // [size]
  std::vector<std::deque<Message>> mailbox;  // [sender * size + receiver]

  int size() const { return static_cast<int>(members.size()); }

  // Blocks until every member has arrived. When `abortable`, throws if the world is aborted
  // before the barrier completes (a completed barrier lets everyone through, so no member
  // leaves while its peers go on). Not abortable: every member is known to be on its way.
  void barrier_wait(bool abortable) {
    std::unique_lock<std::mutex> lock(mutex);
    if (abortable && world->aborted) {
      lock.unlock();
      world->throw_aborted();
    }
    const uint64_t my_generation = generation;
    if (++arrived == size()) {
      arrived = 0;
      ++generation;
      changed.notify_all();
      return;
    }
    changed.wait(lock, [&] { return generation != my_generation || (abortable && world->aborted); });
    if (generation == my_generation) {
      lock.unlock();
      world->throw_aborted();
    }
  }
};

namespace {

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessState> world, std::shared_ptr<Group> group, int rank)
      : world_(std::move(world)), group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string name() const override { return group_->name; }

  void all_reduce_sum(void* data, size_t count, DType dtype) override {
    const size_t bytes = count * dtype_size(dtype);
    std::vector<std::byte> result(bytes);
    collective({Collective::AllReduce, dtype, count, 0, data},
               [&] { sum_inputs(dtype, sends(), 0, count, result.data(), group_->name); });
    if (bytes) std::memcpy(data, result.data(), bytes);
    stats_.record(Collective::AllReduce, static_cast<int64_t>(bytes));
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t block = count * dtype_size(dtype);
    std::vector<std::byte> result(block * size());
    collective({Collective::AllGather, dtype, count, 0, send}, [&] {
      for (int r = 0; r < size(); ++r)
        if (block) std::memcpy(result.data() + r * block, group_->slots[r].send, block);
    });
    if (!result.empty()) std::memcpy(recv, result.data(), result.size());
    stats_.record(Collective::AllGather, static_cast<int64_t>(block));
  }

  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t block = count * dtype_size(dtype);
    std::vector<std::byte> result(block);
    collective({Collective::ReduceScatter, dtype, count, 0, send}, [&] {
      sum_inputs(dtype, sends(), static_cast<size_t>(rank_) * count, count, result.data(), group_->name);
    });
    if (block) std::memcpy(recv, result.data(), block);
    stats_.record(Collective::ReduceScatter, static_cast<int64_t>(block * size()));
  }

  void all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                    const std::vector<size_t>& recv_counts, DType dtype) override {
    const size_t elem = dtype_size(dtype);
    const size_t total_recv = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
    std::vector<std::byte> result(total_recv * elem);
    Slot mine{Collective::AllToAllV, dtype, 0, 0, send};
    mine.send_counts = &send_counts;
    mine.recv_counts = &recv_counts;
    collective(mine, [&] {
      size_t out = 0;
      for (int src = 0; src < size(); ++src) {
        const std::vector<size_t>& counts = *group_->slots[src].send_counts;
        const size_t offset = std::accumulate(counts.begin(), counts.begin() + rank_, size_t{0});
        const size_t n = counts[rank_];
        if (n)
          std::memcpy(result.data() + out * elem,
                      static_cast<const std::byte*>(group_->slots[src].send) + offset * elem, n * elem);
        out += n;
      }
    });
    if (!result.empty()) std::memcpy(recv, result.data(), result.size());
    const size_t total_send = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0});
    stats_.record(Collective::AllToAllV, static_cast<int64_t>(total_send * elem));
  }

  void send(const void* data, size_t count, DType dtype, int peer) override {
    check_peer(peer, "send to");
    Message message{dtype, count, std::vector<std::byte>(count * dtype_size(dtype))};
    if (!message.bytes.empty()) std::memcpy(message.bytes.data(), data, message.bytes.size());
    {
      std::unique_lock<std::mutex> lock(group_->mutex);
      auto& box = group_->mailbox[rank_ * size() + peer];
      const size_t capacity = world_->options.send_capacity;
      group_->changed.wait(lock, [&] { return world_->aborted || capacity == 0 || box.size() < capacity; });
      if (world_->aborted) {
        lock.unlock();
        world_->throw_aborted();
      }
      box.push_back(std::move(message));
    }
    group_->changed.notify_all();
    stats_.record(Collective::Send, static_cast<int64_t>(count * dtype_size(dtype)));
  }

  void recv(void* data, size_t count, DType dtype, int peer) override {
    check_peer(peer, "recv from");
    Message message;
    {
      std::unique_lock<std::mutex> lock(group_->mutex);
      auto& box = group_->mailbox[peer * size() + rank_];
      group_->changed.wait(lock, [&] { return world_->aborted || !box.empty(); });
      if (box.empty()) {
        lock.unlock();
        world_->throw_aborted();
      }
      message = std::move(box.front());
      box.pop_front();
    }
    group_->changed.notify_all();  // a bounded sender may be waiting for room
    MS_CHECK(message.dtype == dtype && message.count == count,
             "group '{}': rank {} expected {} {} elements from rank {}, got {} {} elements", group_->name, rank_, count,
             dtype_name(dtype), peer, message.count, dtype_name(message.dtype));
    if (!message.bytes.empty()) std::memcpy(data, message.bytes.data(), message.bytes.size());
    stats_.record(Collective::Recv, static_cast<int64_t>(count * dtype_size(dtype)));
  }

  void broadcast(void* data, size_t count, DType dtype, int root) override {
    const size_t bytes = count * dtype_size(dtype);
    std::vector<std::byte> result(bytes);
    collective({Collective::Broadcast, dtype, count, root, data}, [&] {
      if (bytes) std::memcpy(result.data(), group_->slots[root].send, bytes);
    });
    if (rank_ != root && bytes) std::memcpy(data, result.data(), bytes);
    stats_.record(Collective::Broadcast, static_cast<int64_t>(bytes));
  }

  void barrier() override {
    collective({Collective::Barrier, DType::U8, 0, 0, nullptr}, [] {});
    stats_.record(Collective::Barrier, 0);
  }

 private:
  std::vector<const void*> sends() const {
    std::vector<const void*> out(size());
    for (int r = 0; r < size(); ++r) out[r] = group_->slots[r].send;
    return out;
  }

  void check_peer(int peer, const char* what) const {
    MS_CHECK(peer >= 0 && peer < size() && peer != rank_, "group '{}': rank {} cannot {} rank {} (group of {})",
             group_->name, rank_, what, peer, size());
  }

  // Every rank checks the whole slot table and finds the same problem, so that all ranks of
  // the group fail the call together. Returns "" when the ranks agree.
  std::string agreement_error() const {
    const Slot& first = group_->slots[0];
    const std::string& g = group_->name;
    for (int r = 1; r < size(); ++r) {
      const Slot& s = group_->slots[r];
      if (s.op != first.op)
        return fmt::format("group '{}': rank 0 called {} while rank {} called {}", g, collective_name(first.op), r,
                           collective_name(s.op));
      if (s.dtype != first.dtype)
        return fmt::format("group '{}' {}: rank 0 uses {} while rank {} uses {}", g, collective_name(first.op),
                           dtype_name(first.dtype), r, dtype_name(s.dtype));
      if (s.count != first.count || s.root != first.root)
        return fmt::format("group '{}' {}: rank 0 has count {} root {} while rank {} has count {} root {}", g,
                           collective_name(first.op), first.count, first.root, r, s.count, s.root);
    }
    const bool sums = first.op == Collective::AllReduce || first.op == Collective::ReduceScatter;
    if (sums && !summable(first.dtype))
      return fmt::format("group '{}' {}: cannot sum {} values", g, collective_name(first.op), dtype_name(first.dtype));
    if (first.op == Collective::Broadcast && (first.root < 0 || first.root >= size()))
      return fmt::format("group '{}' broadcast: root {} outside a group of {}", g, first.root, size());
    if (first.op != Collective::AllToAllV) return "";
    for (int r = 0; r < size(); ++r) {
      const Slot& s = group_->slots[r];
      if (s.send_counts->size() != static_cast<size_t>(size()) || s.recv_counts->size() != static_cast<size_t>(size()))
        return fmt::format("group '{}' all_to_all_v: rank {} gave {} send and {} recv counts for a group of {}", g, r,
                           s.send_counts->size(), s.recv_counts->size(), size());
    }
    for (int src = 0; src < size(); ++src)
      for (int dst = 0; dst < size(); ++dst) {
        const size_t sent = (*group_->slots[src].send_counts)[dst];
        const size_t expected = (*group_->slots[dst].recv_counts)[src];
        if (sent != expected)
          return fmt::format("group '{}' all_to_all_v: rank {} sends {} elements to rank {}, which expects {}", g, src,
                             sent, dst, expected);
      }
    return "";
  }

  // Phase 1 publishes, phase 2 waits until every rank has read the others' buffers. A rank
  // leaves only after phase 2, even when the call fails, so that no peer reads its buffers
  // after they are gone.
  template <typename Read>
  void collective(const Slot& mine, Read&& read) {
    group_->slots[rank_] = mine;
    group_->barrier_wait(/*abortable=*/true);  // a peer may never come
    const std::string error = agreement_error();
    if (error.empty()) read();
    group_->barrier_wait(/*abortable=*/false);  // every peer passed phase 1 and is reading
    if (!error.empty()) fail("{}", error);
  }

  std::shared_ptr<InProcessState> world_;
  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

InProcessWorld::InProcessWorld(int size, InProcessOptions options) : state_(std::make_shared<InProcessState>()) {
  MS_CHECK(size >= 1, "an in-process world needs at least one rank, got {}", size);
  state_->size = size;
  state_->options = options;
}

InProcessWorld::~InProcessWorld() = default;

int InProcessWorld::size() const { return state_->size; }

std::unique_ptr<Communicator> InProcessWorld::communicator(int rank, const std::string& name,
                                                           const std::vector<int>& members) {
  MS_CHECK(!members.empty(), "group '{}': no members", name);
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  MS_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "group '{}': a rank is listed twice",
           name);
  MS_CHECK(sorted.front() >= 0 && sorted.back() < state_->size, "group '{}': members outside the world of {} ranks",
           name, state_->size);
  const auto position = std::find(members.begin(), members.end(), rank);
  MS_CHECK(position != members.end(), "group '{}': rank {} is not a member", name, rank);

  std::string key = name + ":";
  for (int m : members) key += std::to_string(m) + ",";
  std::shared_ptr<Group> group;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto& slot = state_->groups[key];
    if (!slot) {
      slot = std::make_shared<Group>();
      slot->name = name;
      slot->members = members;
      slot->world = state_.get();
      slot->slots.resize(members.size());
      slot->mailbox.resize(members.size() * members.size());
    }
    group = slot;
  }
  return std::make_unique<InProcessCommunicator>(state_, std::move(group),
                                                 static_cast<int>(position - members.begin()));
}

void InProcessWorld::abort(const std::string& reason) {
  std::vector<std::shared_ptr<Group>> groups;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->aborted) return;
    state_->abort_reason = reason;
    state_->aborted = true;
    for (auto& [key, group] : state_->groups) groups.push_back(group);
  }
  for (auto& group : groups) {
    std::lock_guard<std::mutex> lock(group->mutex);  // no waiter can miss the flag
    group->changed.notify_all();
  }
}

bool InProcessWorld::aborted() const { return state_->aborted; }

}  // namespace moeserve::comm
