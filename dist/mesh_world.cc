#include "dist/mesh_world.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <tuple>

#include "comm/rank_order_sum.h"
#include "core/error.h"
#include "dist/wire.h"

namespace moeserve::dist {

namespace {

enum FrameType : uint32_t { kData = 1, kGoodbye = 2, kAbort = 3 };

// What travels before a message's bytes.
struct Envelope {
  uint64_t group = 0;  // group_id() of the group's name and members
  int32_t src = 0;     // sender's group rank
  int32_t dst = 0;     // receiver's world rank
  uint32_t op = 0;     // comm::Collective
  uint32_t dtype = 0;  // DType
  uint64_t count = 0;  // elements
};

struct Message {
  Envelope envelope;
  std::vector<std::byte> bytes;
};

// FNV-1a: the same id in every process for the same group.
uint64_t group_id(const std::string& name, const std::vector<int>& members) {
  std::string key = name + ":";
  for (int m : members) key += std::to_string(m) + ",";
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

struct MeshState {
  MeshOptions options;
  std::vector<std::unique_ptr<Connection>> peers;
  std::vector<std::thread> readers;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::tuple<uint64_t, int, int>, std::deque<Message>> boxes;  // (group, src, dst world rank)
  std::atomic<bool> aborted{false};
  std::atomic<bool> closing{false};
  std::string abort_reason;

  [[noreturn]] void throw_aborted() {
    std::lock_guard<std::mutex> lock(mutex);
    fail("communication aborted: {}", abort_reason);
  }

  // Returns false when it was already aborted.
  bool set_aborted(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (aborted) return false;
      abort_reason = reason;
      aborted = true;
    }
    changed.notify_all();
    return true;
  }

  void deliver(Message message) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      const Envelope& e = message.envelope;
      boxes[{e.group, e.src, e.dst}].push_back(std::move(message));
    }
    changed.notify_all();
  }

  void post(Message message) {
    const int process = options.process_of_rank.at(message.envelope.dst);
    if (process == options.process) return deliver(std::move(message));
    ByteWriter w;
    w.put(message.envelope);
    w.append(message.bytes.data(), message.bytes.size());
    try {
      peers[process]->send(kData, w.bytes());
    } catch (const Error& e) {
      set_aborted(fmt::format("{} lost: {}", options.describe(process), e.what()));
      throw_aborted();
    }
  }

  Message take(uint64_t group, int src, int dst) {
    std::unique_lock<std::mutex> lock(mutex);
    auto& box = boxes[{group, src, dst}];
    changed.wait(lock, [&] { return aborted || !box.empty(); });
    if (box.empty()) {
      lock.unlock();
      throw_aborted();
    }
    Message message = std::move(box.front());
    box.pop_front();
    return message;
  }

  void read_from(int process) {
    Connection& peer = *peers[process];
    try {
      for (;;) {
        Frame frame = peer.recv();
        if (frame.type == kGoodbye) return;
        if (frame.type == kAbort) {
          set_aborted(std::string(reinterpret_cast<const char*>(frame.payload.data()), frame.payload.size()));
          continue;
        }
        ByteReader r(frame.payload, "a data-plane message from " + options.describe(process));
        Message message;
        message.envelope = r.get<Envelope>("envelope");
        message.bytes.resize(frame.payload.size() - sizeof(Envelope));
        r.take(message.bytes.data(), message.bytes.size(), "payload");
        deliver(std::move(message));
      }
    } catch (const std::exception& e) {
      if (!closing) set_aborted(fmt::format("{} lost: {}", options.describe(process), e.what()));
    }
  }
};

namespace {

class MeshCommunicator final : public comm::Communicator {
 public:
  MeshCommunicator(std::shared_ptr<MeshState> state, std::string name, std::vector<int> members, int rank)
      : state_(std::move(state)),
        name_(std::move(name)),
        members_(std::move(members)),
        group_(group_id(name_, members_)),
        rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string name() const override { return name_; }

  void all_reduce_sum(void* data, size_t count, DType dtype) override {
    check_summable(comm::Collective::AllReduce, dtype);
    const size_t bytes = count * dtype_size(dtype);
    for (int r = 0; r < size(); ++r)
      if (r != rank_) post(r, comm::Collective::AllReduce, dtype, count, data);
    std::vector<Message> received = take_all(comm::Collective::AllReduce, dtype, count);
    std::vector<std::byte> result(bytes);
    comm::sum_inputs(dtype, inputs(received, data), 0, count, result.data(), name_);
    if (bytes) std::memcpy(data, result.data(), bytes);
    stats_.record(comm::Collective::AllReduce, static_cast<int64_t>(bytes));
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t block = count * dtype_size(dtype);
    for (int r = 0; r < size(); ++r)
      if (r != rank_) post(r, comm::Collective::AllGather, dtype, count, send);
    std::vector<Message> received = take_all(comm::Collective::AllGather, dtype, count);
    const std::vector<const void*> blocks = inputs(received, send);
    for (int r = 0; r < size(); ++r)
      if (block) std::memmove(static_cast<std::byte*>(recv) + r * block, blocks[r], block);
    stats_.record(comm::Collective::AllGather, static_cast<int64_t>(block));
  }

  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype) override {
    check_summable(comm::Collective::ReduceScatter, dtype);
    const size_t block = count * dtype_size(dtype);
    const auto* in = static_cast<const std::byte*>(send);
    for (int r = 0; r < size(); ++r)
      if (r != rank_) post(r, comm::Collective::ReduceScatter, dtype, count, in + r * block);
    std::vector<Message> received = take_all(comm::Collective::ReduceScatter, dtype, count);
    std::vector<std::byte> result(block);
    comm::sum_inputs(dtype, inputs(received, in + rank_ * block), 0, count, result.data(), name_);
    if (block) std::memcpy(recv, result.data(), block);
    stats_.record(comm::Collective::ReduceScatter, static_cast<int64_t>(block * size()));
  }

  void all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                    const std::vector<size_t>& recv_counts, DType dtype) override {
    MS_CHECK(send_counts.size() == static_cast<size_t>(size()) && recv_counts.size() == static_cast<size_t>(size()),
             "group '{}' all_to_all_v: rank {} gave {} send and {} recv counts for a group of {}", name_, rank_,
             send_counts.size(), recv_counts.size(), size());
    const size_t elem = dtype_size(dtype);
    const auto* in = static_cast<const std::byte*>(send);
    std::vector<size_t> send_offset(size(), 0);
    for (int r = 1; r < size(); ++r) send_offset[r] = send_offset[r - 1] + send_counts[r - 1];
    for (int r = 0; r < size(); ++r)
      if (r != rank_) post(r, comm::Collective::AllToAllV, dtype, send_counts[r], in + send_offset[r] * elem);
    std::vector<std::byte> result(std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}) * elem);
    size_t out = 0;
    for (int src = 0; src < size(); ++src) {
      const size_t n = recv_counts[src];
      if (src == rank_) {
        MS_CHECK(send_counts[src] == n, "group '{}' all_to_all_v: rank {} sends {} elements to itself, expects {}",
                 name_, rank_, send_counts[src], n);
        if (n) std::memcpy(result.data() + out * elem, in + send_offset[src] * elem, n * elem);
      } else {
        Message m = take(src, comm::Collective::AllToAllV, dtype, n);
        if (n) std::memcpy(result.data() + out * elem, m.bytes.data(), n * elem);
      }
      out += n;
    }
    if (!result.empty()) std::memcpy(recv, result.data(), result.size());
    const size_t total_send = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0});
    stats_.record(comm::Collective::AllToAllV, static_cast<int64_t>(total_send * elem));
  }

  void send(const void* data, size_t count, DType dtype, int peer) override {
    check_peer(peer, "send to");
    post(peer, comm::Collective::Send, dtype, count, data);
    stats_.record(comm::Collective::Send, static_cast<int64_t>(count * dtype_size(dtype)));
  }

  void recv(void* data, size_t count, DType dtype, int peer) override {
    check_peer(peer, "recv from");
    Message m = take(peer, comm::Collective::Send, dtype, count);
    if (!m.bytes.empty()) std::memcpy(data, m.bytes.data(), m.bytes.size());
    stats_.record(comm::Collective::Recv, static_cast<int64_t>(count * dtype_size(dtype)));
  }

  void broadcast(void* data, size_t count, DType dtype, int root) override {
    MS_CHECK(root >= 0 && root < size(), "group '{}' broadcast: root {} outside a group of {}", name_, root, size());
    if (rank_ == root) {
      for (int r = 0; r < size(); ++r)
        if (r != rank_) post(r, comm::Collective::Broadcast, dtype, count, data);
    } else {
      Message m = take(root, comm::Collective::Broadcast, dtype, count);
      if (!m.bytes.empty()) std::memcpy(data, m.bytes.data(), m.bytes.size());
    }
    stats_.record(comm::Collective::Broadcast, static_cast<int64_t>(count * dtype_size(dtype)));
  }

  void barrier() override {
    for (int r = 0; r < size(); ++r)
      if (r != rank_) post(r, comm::Collective::Barrier, DType::U8, 0, nullptr);
    take_all(comm::Collective::Barrier, DType::U8, 0);
    stats_.record(comm::Collective::Barrier, 0);
  }

 private:
  void check_summable(comm::Collective op, DType dtype) const {
    MS_CHECK(comm::summable(dtype), "group '{}' {}: cannot sum {} values", name_, comm::collective_name(op),
             dtype_name(dtype));
  }

  void check_peer(int peer, const char* what) const {
    MS_CHECK(peer >= 0 && peer < size() && peer != rank_, "group '{}': rank {} cannot {} rank {} (group of {})", name_,
             rank_, what, peer, size());
  }

  void post(int dst, comm::Collective op, DType dtype, size_t count, const void* data) {
    if (state_->aborted) state_->throw_aborted();
    Message m;
    m.envelope = {group_, rank_, members_[dst], static_cast<uint32_t>(op), static_cast<uint32_t>(dtype), count};
    m.bytes.resize(count * dtype_size(dtype));
    if (!m.bytes.empty()) std::memcpy(m.bytes.data(), data, m.bytes.size());
    state_->post(std::move(m));
  }

  // The next message from group rank `src`, checked to be the call this rank makes.
  Message take(int src, comm::Collective op, DType dtype, size_t count) {
    Message m = state_->take(group_, src, members_[rank_]);
    const Envelope& e = m.envelope;
    const auto their_op = static_cast<comm::Collective>(e.op);
    MS_CHECK(their_op == op, "group '{}': rank {} called {} while rank {} called {}", name_, rank_,
             comm::collective_name(op), src, comm::collective_name(their_op));
    MS_CHECK(e.dtype == static_cast<uint32_t>(dtype) && e.count == count,
             "group '{}' {}: rank {} expects {} {} elements from rank {}, which sent {} {} elements", name_,
             comm::collective_name(op), rank_, count, dtype_name(dtype), src, e.count,
             dtype_name(static_cast<DType>(e.dtype)));
    return m;
  }

  // One message from every other member, in group-rank order (own slot left empty).
  std::vector<Message> take_all(comm::Collective op, DType dtype, size_t count) {
    std::vector<Message> out(size());
    for (int r = 0; r < size(); ++r)
      if (r != rank_) out[r] = take(r, op, dtype, count);
    return out;
  }

  // Every member's buffer in group-rank order: the received ones and this rank's `own`.
  std::vector<const void*> inputs(const std::vector<Message>& received, const void* own) const {
    std::vector<const void*> out(size());
    for (int r = 0; r < size(); ++r) out[r] = r == rank_ ? own : received[r].bytes.data();
    return out;
  }

  std::shared_ptr<MeshState> state_;
  std::string name_;
  std::vector<int> members_;
  uint64_t group_;
  int rank_;
};

}  // namespace

MeshWorld::MeshWorld(MeshOptions options, std::vector<std::unique_ptr<Connection>> peers)
    : state_(std::make_shared<MeshState>()) {
  state_->options = std::move(options);
  state_->peers = std::move(peers);
  for (int p = 0; p < static_cast<int>(state_->peers.size()); ++p)
    if (state_->peers[p]) state_->readers.emplace_back([state = state_.get(), p] { state->read_from(p); });
}

MeshWorld::~MeshWorld() {
  state_->closing = true;
  for (auto& peer : state_->peers) {
    if (!peer) continue;
    try {
      peer->send(kGoodbye, nullptr, 0);
    } catch (const Error&) {  // the peer is gone already
    }
    peer->close();
  }
  for (auto& reader : state_->readers) reader.join();
}

int MeshWorld::size() const { return static_cast<int>(state_->options.process_of_rank.size()); }

std::unique_ptr<comm::Communicator> MeshWorld::communicator(int rank, const std::string& name,
                                                            const std::vector<int>& members) {
  MS_CHECK(!members.empty(), "group '{}': no members", name);
  for (int m : members)
    MS_CHECK(m >= 0 && m < size(), "group '{}': member {} outside the world of {} ranks", name, m, size());
  const auto position = std::find(members.begin(), members.end(), rank);
  MS_CHECK(position != members.end(), "group '{}': rank {} is not a member", name, rank);
  MS_CHECK(state_->options.process_of_rank[rank] == state_->options.process,
           "group '{}': rank {} does not live in this process", name, rank);
  return std::make_unique<MeshCommunicator>(state_, name, members, static_cast<int>(position - members.begin()));
}

void MeshWorld::abort(const std::string& reason) {
  if (!state_->set_aborted(reason)) return;
  for (auto& peer : state_->peers) {
    if (!peer) continue;
    try {
      peer->send(kAbort, reason.data(), reason.size());
    } catch (const Error&) {  // that peer is the one lost
    }
  }
}

bool MeshWorld::aborted() const { return state_->aborted; }

std::string MeshWorld::abort_reason() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->abort_reason;
}

}  // namespace moeserve::dist
