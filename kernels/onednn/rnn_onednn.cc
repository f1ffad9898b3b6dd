#include "kernels/onednn/rnn_onednn.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace numaserve::kernels {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr memory::data_type kF32 = memory::data_type::f32;

int64_t GatesOf(RnnCell cell) { return cell == RnnCell::kLstm ? 4 : 3; }

// For oneDNN's gate g, the ONNX gate it is: LSTM i, f, c~, o from ONNX's
// i, o, f, c; GRU u, r, o are ONNX's z, r, h.
int64_t OnnxGate(RnnCell cell, int64_t g) {
  static constexpr int64_t kLstm[] = {0, 2, 3, 1};
  return cell == RnnCell::kLstm ? kLstm[g] : g;
}

// ONNX's [D, G * H, K] (K = input or hidden) as oneDNN's ldigo
// [1, D, K, G, H] in oneDNN's gate order.
std::vector<float> ToLdigo(const std::vector<float>& onnx, RnnCell cell, int64_t directions,
                           int64_t k_size, int64_t hidden) {
  const int64_t gates = GatesOf(cell);
  std::vector<float> out(onnx.size());
  for (int64_t d = 0; d < directions; ++d) {
    for (int64_t g = 0; g < gates; ++g) {
      const int64_t from_gate = OnnxGate(cell, g);
      for (int64_t j = 0; j < hidden; ++j) {
        const float* row = onnx.data() + ((d * gates + from_gate) * hidden + j) * k_size;
        for (int64_t k = 0; k < k_size; ++k) {
          out[((d * k_size + k) * gates + g) * hidden + j] = row[k];
        }
      }
    }
  }
  return out;
}

// ONNX's B [D, 2 * G * H] (Wb, Rb) as oneDNN's ldgo bias [1, D, Gb, H]:
// Wb + Rb per gate; lbr_gru's candidate gate takes Wb alone and its
// fourth gate Rb. Zeros where B is absent.
std::vector<float> ToBias(const std::vector<float>& onnx, RnnCell cell, int64_t directions,
                          int64_t hidden) {
  const int64_t gates = GatesOf(cell);
  const int64_t bias_gates = cell == RnnCell::kLbrGru ? 4 : gates;
  std::vector<float> out(directions * bias_gates * hidden, 0.0f);
  if (onnx.empty()) return out;
  for (int64_t d = 0; d < directions; ++d) {
    const float* wb = onnx.data() + d * 2 * gates * hidden;
    const float* rb = wb + gates * hidden;
    float* to = out.data() + d * bias_gates * hidden;
    for (int64_t g = 0; g < gates; ++g) {
      const int64_t from = OnnxGate(cell, g) * hidden;
      const bool split = cell == RnnCell::kLbrGru && g == 2;
      for (int64_t j = 0; j < hidden; ++j) {
        to[g * hidden + j] = wb[from + j] + (split ? 0.0f : rb[from + j]);
        if (split) to[3 * hidden + j] = rb[from + j];
      }
    }
  }
  return out;
}

// ONNX's P [D, 3 * H] (i, o, f) as oneDNN's ldgo [1, D, 3, H] (i, f, o).
std::vector<float> ToPeephole(const std::vector<float>& onnx, int64_t directions, int64_t hidden) {
  static constexpr int64_t kFrom[] = {0, 2, 1};
  std::vector<float> out(onnx.size());
  for (int64_t d = 0; d < directions; ++d) {
    for (int64_t g = 0; g < 3; ++g) {
      std::memcpy(out.data() + (d * 3 + g) * hidden, onnx.data() + (d * 3 + kFrom[g]) * hidden,
                  hidden * sizeof(float));
    }
  }
  return out;
}

dnnl::rnn_direction DnnlDirection(RnnDirection direction) {
  switch (direction) {
    case RnnDirection::kForward:
      return dnnl::rnn_direction::unidirectional_left2right;
    case RnnDirection::kReverse:
      return dnnl::rnn_direction::unidirectional_right2left;
    case RnnDirection::kBidirectional:
      return dnnl::rnn_direction::bidirectional_concat;
  }
  return dnnl::rnn_direction::unidirectional_left2right;
}

}  // namespace

const char* RnnCellName(RnnCell cell) {
  switch (cell) {
    case RnnCell::kLstm:
      return "lstm";
    case RnnCell::kGru:
      return "gru";
    case RnnCell::kLbrGru:
      return "lbr_gru";
  }
  return "?";
}

const char* RnnDirectionName(RnnDirection direction) {
  switch (direction) {
    case RnnDirection::kForward:
      return "forward";
    case RnnDirection::kReverse:
      return "reverse";
    case RnnDirection::kBidirectional:
      return "bidirectional";
  }
  return "?";
}

RnnOnednn::RnnOnednn(const dnnl::engine& engine, const RnnParams& params)
    : engine_(engine),
      cell_(params.cell),
      direction_(params.direction),
      directions_(params.direction == RnnDirection::kBidirectional ? 2 : 1),
      gates_(GatesOf(params.cell)),
      input_(params.input),
      hidden_(params.hidden),
      has_initial_h_(params.has_initial_h),
      has_initial_c_(params.cell == RnnCell::kLstm && params.has_initial_c),
      peepholes_(params.cell == RnnCell::kLstm && !params.p.empty()) {}

absl::StatusOr<std::unique_ptr<RnnOnednn>> RnnOnednn::Create(const dnnl::engine& engine,
                                                             const RnnParams& params) {
  const int64_t d = params.direction == RnnDirection::kBidirectional ? 2 : 1;
  const int64_t g = GatesOf(params.cell), h = params.hidden, in = params.input;
  auto size_is = [](const std::vector<float>& v, int64_t n) {
    return static_cast<int64_t>(v.size()) == n;
  };
  if (h < 1 || in < 1 || !size_is(params.w, d * g * h * in) || !size_is(params.r, d * g * h * h) ||
      !(params.b.empty() || size_is(params.b, d * 2 * g * h)) ||
      !(params.p.empty() || (params.cell == RnnCell::kLstm && size_is(params.p, d * 3 * h)))) {
    return absl::InvalidArgumentError(
        absl::StrCat("RNN parameters do not fit input ", in, ", hidden ", h, ", ", d,
                     " direction(s): W ", params.w.size(), ", R ", params.r.size(), ", B ",
                     params.b.size(), ", P ", params.p.size(), " floats"));
  }
  std::unique_ptr<RnnOnednn> rnn(new RnnOnednn(engine, params));
  rnn->weights_layer_data_ = ToLdigo(params.w, params.cell, d, in, h);
  rnn->weights_iter_data_ = ToLdigo(params.r, params.cell, d, h, h);
  rnn->bias_data_ = ToBias(params.b, params.cell, d, h);
  if (rnn->peepholes_) rnn->peephole_data_ = ToPeephole(params.p, d, h);
  try {
    const int64_t bias_gates = params.cell == RnnCell::kLbrGru ? 4 : g;
    rnn->weights_layer_ =
        memory({{1, d, in, g, h}, kF32, tag::ldigo}, engine, rnn->weights_layer_data_.data());
    rnn->weights_iter_ =
        memory({{1, d, h, g, h}, kF32, tag::ldigo}, engine, rnn->weights_iter_data_.data());
    rnn->bias_ = memory({{1, d, bias_gates, h}, kF32, tag::ldgo}, engine, rnn->bias_data_.data());
    if (rnn->peepholes_) {
      rnn->peephole_ = memory({{1, d, 3, h}, kF32, tag::ldgo}, engine, rnn->peephole_data_.data());
    }
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "creating the RNN's weights");
  }
  return rnn;
}

dnnl::memory RnnOnednn::PreparedWeights(const memory& plain, const memory::desc& want,
                                        dnnl::stream& stream) {
  if (plain.get_desc() == want) return plain;
  const void* source = plain.get_data_handle();
  for (const PreparedWeightsEntry& entry : prepared_) {
    if (entry.source == source && entry.desc == want) return entry.prepared;
  }
  memory src = plain;
  memory prepared(want, engine_);
  dnnl::reorder(src, prepared).execute(stream, src, prepared);
  stream.wait();
  // A few layouts at most; the oldest dropped past 8 (cached primitives
  // keep their own reference to theirs).
  if (prepared_.size() >= 8) prepared_.erase(prepared_.begin());
  prepared_.push_back({source, want, prepared});
  return prepared;
}

absl::StatusOr<RnnOnednn::PerShape*> RnnOnednn::Prepare(int64_t seq, int64_t batch) {
  if (PerShape* found = per_shape_.Find(std::make_tuple(seq, batch)); found != nullptr) {
    return found;
  }
  const int64_t d = directions_, g = gates_, h = hidden_;
  const bool lstm = cell_ == RnnCell::kLstm;
  const bool initial = has_initial_h_ || has_initial_c_;
  const memory::desc src_layer({seq, batch, input_}, kF32, tag::tnc);
  const memory::desc state({1, d, batch, h}, kF32, tag::ldnc);
  const memory::desc src_iter = initial ? state : memory::desc();
  const memory::desc src_iter_c = initial && lstm ? state : memory::desc();
  const memory::desc weights_layer({1, d, input_, g, h}, kF32, tag::any);
  const memory::desc weights_iter({1, d, h, g, h}, kF32, tag::any);
  const memory::desc dst_layer({seq, batch, d * h}, kF32, tag::tnc);
  const auto prop = dnnl::prop_kind::forward_inference;
  const auto direction = DnnlDirection(direction_);
  try {
    dnnl::primitive_desc pd;
    if (lstm) {
      const memory::desc peephole = peepholes_ ? peephole_.get_desc() : memory::desc();
      pd = dnnl::lstm_forward::primitive_desc(engine_, prop, direction, src_layer, src_iter,
                                              src_iter_c, weights_layer, weights_iter, peephole,
                                              bias_.get_desc(), dst_layer, state, state);
    } else if (cell_ == RnnCell::kGru) {
      pd = dnnl::gru_forward::primitive_desc(engine_, prop, direction, src_layer, src_iter,
                                             weights_layer, weights_iter, bias_.get_desc(),
                                             dst_layer, state);
    } else {
      pd = dnnl::lbr_gru_forward::primitive_desc(engine_, prop, direction, src_layer, src_iter,
                                                 weights_layer, weights_iter, bias_.get_desc(),
                                                 dst_layer, state);
    }
    dnnl::stream stream(engine_);
    PerShape created;
    created.call.primitive = dnnl::primitive(pd);
    auto& args = created.call.args;
    args[DNNL_ARG_SRC_LAYER] = UnboundMemory(src_layer, engine_);
    if (initial) args[DNNL_ARG_SRC_ITER] = UnboundMemory(state, engine_);
    if (initial && lstm) args[DNNL_ARG_SRC_ITER_C] = UnboundMemory(state, engine_);
    args[DNNL_ARG_WEIGHTS_LAYER] = PreparedWeights(
        weights_layer_, pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_WEIGHTS_LAYER), stream);
    args[DNNL_ARG_WEIGHTS_ITER] = PreparedWeights(
        weights_iter_, pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_WEIGHTS_ITER), stream);
    if (peepholes_) args[DNNL_ARG_WEIGHTS_PEEPHOLE] = peephole_;
    args[DNNL_ARG_BIAS] = bias_;
    args[DNNL_ARG_DST_LAYER] = UnboundMemory(dst_layer, engine_);
    args[DNNL_ARG_DST_ITER] = UnboundMemory(state, engine_);
    if (lstm) args[DNNL_ARG_DST_ITER_C] = UnboundMemory(state, engine_);
    created.impl = created.call.ImplementationName();
    return &per_shape_.Emplace(std::make_tuple(seq, batch), std::move(created));
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(
        e, absl::StrCat("creating ", RnnCellName(cell_), " for seq ", seq, ", batch ", batch));
  }
}

absl::Status RnnOnednn::Execute(dnnl::stream& stream, int64_t seq, int64_t batch,
                                const RnnBuffers& io) {
  if (seq < 1 || batch < 1 || io.x == nullptr || io.y == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("RNN run at seq ", seq, ", batch ", batch, " without its buffers"));
  }
  auto call = Prepare(seq, batch);
  if (!call.ok()) return call.status();
  const int64_t d = directions_, h = hidden_;
  const size_t state_floats = static_cast<size_t>(d * batch * h);
  const bool lstm = cell_ == RnnCell::kLstm;
  const bool initial = has_initial_h_ || has_initial_c_;
  const bool concat = direction_ == RnnDirection::kBidirectional;
  if (initial && (io.h0 == nullptr || (lstm && io.c0 == nullptr))) zeros_.assign(state_floats, 0);
  if (concat) concat_.resize(static_cast<size_t>(seq * batch * d * h));
  if (io.y_h == nullptr) unread_h_.resize(state_floats);
  if (lstm && io.y_c == nullptr) unread_c_.resize(state_floats);
  try {
    BoundPrimitive& p = (*call)->call;
    p.SetHandle(DNNL_ARG_SRC_LAYER, io.x);
    if (initial) p.SetHandle(DNNL_ARG_SRC_ITER, io.h0 != nullptr ? io.h0 : zeros_.data());
    if (initial && lstm) p.SetHandle(DNNL_ARG_SRC_ITER_C, io.c0 != nullptr ? io.c0 : zeros_.data());
    p.SetHandle(DNNL_ARG_DST_LAYER, concat ? concat_.data() : io.y);
    p.SetHandle(DNNL_ARG_DST_ITER, io.y_h != nullptr ? io.y_h : unread_h_.data());
    if (lstm) p.SetHandle(DNNL_ARG_DST_ITER_C, io.y_c != nullptr ? io.y_c : unread_c_.data());
    p.Execute(stream);
    stream.wait();
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, absl::StrCat("executing ", RnnCellName(cell_)));
  }
  if (concat) {
    // oneDNN's [seq, batch, 2 * hidden] as ONNX's Y [seq, 2, batch, hidden].
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t dir = 0; dir < d; ++dir) {
        for (int64_t n = 0; n < batch; ++n) {
          std::memcpy(io.y + ((t * d + dir) * batch + n) * h,
                      concat_.data() + ((t * batch + n) * d + dir) * h, h * sizeof(float));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RnnOnednn::Probe(int64_t seq, int64_t batch) {
  if (seq < 1 || batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("RNN probed at seq ", seq, ", batch ", batch));
  }
  auto call = Prepare(seq, batch);
  if (!call.ok()) return call.status();
  return (*call)->impl;
}

std::string RnnOnednn::ImplementationName(int64_t seq, int64_t batch) const {
  const PerShape* call = per_shape_.Peek(std::make_tuple(seq, batch));
  return call == nullptr ? "" : call->impl;
}

}  // namespace numaserve::kernels
