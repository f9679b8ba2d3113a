#include "dist/step_codec.h"

namespace moeserve::dist {

namespace {

void encode_batch(const ForwardBatch& b, ByteWriter& w) {
  w.put_vector(b.tokens);
  w.put_vector(b.positions);
  w.put_vector(b.seq_of_token);
  w.put_vector(b.slots);
  w.put_vector(b.block_tables);
  w.put<int64_t>(b.max_pages_per_seq);
  w.put_vector(b.logit_rows);
  w.put<int32_t>(static_cast<int32_t>(b.draw));
  w.put_vector(b.temperatures);
  w.put_vector(b.sampling);
  w.put_vector(b.mtp_tokens);
  w.put<uint8_t>(b.mtp_draft ? 1 : 0);
  w.put_vector(b.mtp_hidden_rows);
  // Structured output is refused across processes (apps/cmd_serve.cc): its masks are filled
  // after the step is sent.
  MS_CHECK(!b.token_bitmask, "a step's batch: token bitmasks do not travel between processes");
  w.put_vector(b.logit_adjust);
}

ForwardBatch decode_batch(ByteReader& r) {
  ForwardBatch b;
  b.tokens = r.get_vector<int32_t>("tokens");
  b.positions = r.get_vector<int32_t>("positions");
  b.seq_of_token = r.get_vector<int32_t>("seq_of_token");
  b.slots = r.get_vector<int32_t>("slots");
  b.block_tables = r.get_vector<int32_t>("block_tables");
  b.max_pages_per_seq = r.get<int64_t>("max_pages_per_seq");
  b.logit_rows = r.get_vector<int32_t>("logit_rows");
  const int32_t draw = r.get<int32_t>("draw");
  MS_CHECK(draw >= 0 && draw <= static_cast<int32_t>(DrawKind::kSampled), "a step's batch: draw kind {} is unknown",
           draw);
  b.draw = static_cast<DrawKind>(draw);
  b.temperatures = r.get_vector<float>("temperatures");
  b.sampling = r.get_vector<ops::SamplingOptions>("sampling");
  b.mtp_tokens = r.get_vector<int32_t>("mtp_tokens");
  b.mtp_draft = r.get<uint8_t>("mtp_draft") != 0;
  b.mtp_hidden_rows = r.get_vector<int32_t>("mtp_hidden_rows");
  b.logit_adjust = r.get_vector<ops::LogitAdjustEntry>("logit_adjust");
  return b;
}

}  // namespace

void encode_step(const step::StepPlan& step, ByteWriter& w) {
  w.put<uint64_t>(step.micro_batches.size());
  for (const step::MicroBatch& mb : step.micro_batches) {
    w.put<uint64_t>(mb.replicas.size());
    for (const step::ReplicaBatch& rb : mb.replicas) {
      encode_batch(rb.batch, w);
      w.put_vector(rb.sequences);
      w.put_vector(rb.first_row);
      w.put_vector(rb.num_rows);
    }
  }
}

step::StepPlan decode_step(ByteReader& r) {
  step::StepPlan step;
  step.micro_batches.resize(r.get<uint64_t>("micro_batches"));
  for (step::MicroBatch& mb : step.micro_batches) {
    mb.replicas.resize(r.get<uint64_t>("replicas"));
    for (step::ReplicaBatch& rb : mb.replicas) {
      rb.batch = decode_batch(r);
      rb.sequences = r.get_vector<size_t>("sequences");
      rb.first_row = r.get_vector<int64_t>("first_row");
      rb.num_rows = r.get_vector<int64_t>("num_rows");
    }
  }
  return step;
}

}  // namespace moeserve::dist
