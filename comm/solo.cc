#include <cstring>

#include "comm/communicator.h"
#include "core/error.h"

namespace moeserve::comm {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce:
      return "all_reduce";
    case Collective::AllGather:
      return "all_gather";
    case Collective::ReduceScatter:
      return "reduce_scatter";
    case Collective::AllToAllV:
      return "all_to_all_v";
    case Collective::Send:
      return "send";
    case Collective::Recv:
      return "recv";
    case Collective::Broadcast:
      return "broadcast";
    case Collective::Barrier:
      return "barrier";
  }
  return "unknown";
}

namespace {

class SoloCommunicator final : public Communicator {
 public:
  explicit SoloCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  void all_reduce_sum(void*, size_t, DType) override {}
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    if (send != recv) std::memmove(recv, send, count * dtype_size(dtype));
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype) override {
    if (send != recv) std::memmove(recv, send, count * dtype_size(dtype));
  }
  void all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                    const std::vector<size_t>& recv_counts, DType dtype) override {
    MS_CHECK(send_counts.size() == 1 && recv_counts.size() == 1 && send_counts[0] == recv_counts[0],
             "all_to_all_v on a group of one needs matching single counts");
    if (send != recv) std::memmove(recv, send, send_counts[0] * dtype_size(dtype));
  }
  void send(const void*, size_t, DType, int peer) override { fail("send to rank {} in a group of one", peer); }
  void recv(void*, size_t, DType, int peer) override { fail("recv from rank {} in a group of one", peer); }
  void broadcast(void*, size_t, DType, int) override {}
  void barrier() override {}

 private:
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_solo_communicator(std::string name) {
  return std::make_unique<SoloCommunicator>(std::move(name));
}

}  // namespace moeserve::comm
